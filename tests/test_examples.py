"""The training loops in examples/: each runs as a user runs it, for a few steps on the CPU on tiny data."""
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from feedline.datagen.synthetic_criteo import make_criteo
from feedline.datagen.images import make_images

ROOT = Path(__file__).resolve().parents[1]
STEPS = 3


def load_example(name: str):
    if str(ROOT / "examples") not in sys.path:  # as when run as a script: its folder's example_args imports
        sys.path.insert(0, str(ROOT / "examples"))
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_example(name: str, *args: str) -> dict:
    """Run ``python examples/<name>.py args`` from the repository root; return its closing JSON line."""
    done = subprocess.run([sys.executable, f"examples/{name}.py", *args], cwd=ROOT, check=False,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{name} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["steps"] == STEPS
    assert 0.0 <= result["wait_share"] <= 1.0
    assert result["samples_per_s"] > 0
    assert math.isfinite(result["loss_start"]) and math.isfinite(result["loss_end"])
    for fact in ("steps:", "samples/s:", "waiting for data:", "loss:"):
        assert fact in done.stdout
    return result


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("example_images") / "train"
    make_images(root, count=40, classes=4, seed=0, progress=False)
    return root


@pytest.fixture(scope="module")
def criteo_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("example_criteo") / "criteo.tsv"
    make_criteo(path, rows=5000, seed=0)
    return path


@pytest.fixture(scope="module")
def dlrm():
    return load_example("train_dlrm")


@pytest.fixture(scope="module")
def torchrec_missing(dlrm):
    """None where torchrec imports, else the reason it does not."""
    return dlrm.torchrec_error()


def test_resnet_trains_on_the_cpu(images):
    result = run_example("train_resnet", "--data", str(images), "--device", "cpu", "--size", "64",
                         "--batch-size", "8", "--steps", str(STEPS), "--num-threads", "2", "--seed", "1")
    assert result["samples"] == STEPS * 8
    assert result["device"] == "cpu"


@pytest.mark.parametrize("backend", ["torch", "torchrec"])
def test_dlrm_trains_on_the_cpu(criteo_file, backend, torchrec_missing):
    if backend == "torchrec" and torchrec_missing:
        pytest.skip(f"torchrec does not import here: {torchrec_missing}")
    result = run_example("train_dlrm", "--data", str(criteo_file), "--device", "cpu", "--batch-size", "512",
                         "--steps", str(STEPS), "--table-size", "1000", "--embedding-dim", "8",
                         "--embedding-backend", backend)
    assert result["embedding_backend"] == backend
    assert result["samples"] == STEPS * 512


def test_dlrm_embedding_backends_agree(dlrm, criteo_file, torchrec_missing):
    """nn.EmbeddingBag fed from the key-major layout pools exactly what TorchRec's collection pools."""
    if torchrec_missing:
        pytest.skip(f"torchrec does not import here: {torchrec_missing}")
    from feedline.loader import Loader
    from feedline.pipelines.criteo import CATEGORICAL_NAMES, criteo
    batch = next(iter(Loader(criteo(criteo_file, table_sizes=50), batch_size=64, placement="cpu", device="cpu")))
    keys = list(CATEGORICAL_NAMES)
    torchrec_tables = dlrm.TorchRecEmbeddings(keys, 50, 4, torch.device("cpu"))
    torch_tables = dlrm.TorchEmbeddings(keys, 50, 4, torch.device("cpu"))
    with torch.no_grad():
        for key, bag in zip(keys, torch_tables.bags):
            bag.weight.copy_(torchrec_tables.tables.embedding_bags[f"table_{key}"].weight)
    pooled = torch_tables(batch["sparse"])
    assert pooled.shape == (64, len(keys), 4)
    assert torch.equal(pooled, torchrec_tables(batch["sparse"]))
    sparse, weights = batch["sparse"], torch_tables.bags[3].weight  # key C4, sample 5, by hand
    first, last = sparse["offsets"][3 * 64 + 5], sparse["offsets"][3 * 64 + 6]
    assert torch.allclose(pooled[5, 3], weights[sparse["values"][first:last]].sum(0))


def test_arguments_are_checked(dlrm, tmp_path, capsys):
    resnet = load_example("train_resnet")
    missing = str(tmp_path / "no-such-data")
    for main in (resnet.main, dlrm.main):
        with pytest.raises(SystemExit):
            main(["--data", missing])
        assert missing in capsys.readouterr().err
        with pytest.raises(SystemExit):
            main(["--data", str(tmp_path), "--steps", "0"])
        assert "expected a positive integer, got '0'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        resnet.main(["--data", str(tmp_path), "--device", "tpu"])
    assert "expected 'cpu' or 'cuda', got 'tpu'" in capsys.readouterr().err
