# Every target creates .venv on first use, so a fresh machine needs nothing installed by hand.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.feedline-installed
BENCH_DATA ?= data/images
BENCH_COUNT ?= 2000
BENCH_CRITEO ?= data/criteo.tsv
BENCH_CRITEO_ROWS ?= 1000000

.PHONY: setup bench bench-remote test clean

setup: $(STAMP)

$(STAMP): pyproject.toml requirements-dev.txt requirements-torchrec.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	$(PY) -m pip install --quiet --no-deps -r requirements-torchrec.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

bench: setup
	test -f $(BENCH_DATA)/.feedline-data || $(VENV)/bin/feedline make-data images --out $(BENCH_DATA) --count $(BENCH_COUNT) --classes 10 --seed 0
	$(VENV)/bin/feedline bench --pipeline image-train --data $(BENCH_DATA) --baseline torchvision --trainer-step-ms auto --json bench-image-train.json
	test -f $(BENCH_CRITEO) || $(VENV)/bin/feedline make-data criteo --out $(BENCH_CRITEO) --rows $(BENCH_CRITEO_ROWS) --seed 0
	$(VENV)/bin/feedline bench --pipeline criteo --data $(BENCH_CRITEO) --baseline pandas --trainer-step-ms auto --json bench-criteo-pandas.json
	$(VENV)/bin/feedline bench --pipeline criteo --data $(BENCH_CRITEO) --baseline torchrec --json bench-criteo-torchrec.json
	$(VENV)/bin/feedline bench --pipeline criteo --data $(BENCH_CRITEO) --baseline pyarrow --json bench-criteo-pyarrow.json

# Ray binds the machine's interface address; where only loopback is allowed it runs in a namespace with only lo.
bench-remote: setup
	test -f $(BENCH_DATA)/.feedline-data || $(VENV)/bin/feedline make-data images --out $(BENCH_DATA) --count $(BENCH_COUNT) --classes 10 --seed 0
	unshare -rn sh -c 'ip link set lo up && exec $(VENV)/bin/feedline bench --pipeline image-train --data $(BENCH_DATA) --remote-workers 1 --json bench-remote-image-train.json'
	test -f $(BENCH_CRITEO) || $(VENV)/bin/feedline make-data criteo --out $(BENCH_CRITEO) --rows $(BENCH_CRITEO_ROWS) --seed 0
	unshare -rn sh -c 'ip link set lo up && exec $(VENV)/bin/feedline bench --pipeline criteo --data $(BENCH_CRITEO) --remote-workers 1 --json bench-remote-criteo.json'

test: setup
	$(PY) -m pytest -q -rs --strict-markers --durations=15 tests

clean:
	rm -rf $(VENV) data bench-*.json
