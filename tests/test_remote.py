"""Remote workers on Ray (RayWorkers): every scenario runs in one child process (one local cluster), inside a
private network namespace where only loopback is up; these machines allow no other traffic, and Ray uses the
machine's interface address whenever it has one."""
import ipaddress
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import write_images
from feedline.datagen.synthetic_criteo import make_criteo
from feedline.loader import Loader, RayWorkers
from feedline.loader.runners.remote import batches_per_group
from feedline.loader.sources.text_to_columnar import convert
from feedline.pipelines.criteo import criteo

pytest.importorskip("ray", reason="Ray is not installed (pip install 'feedline[ray]')")

SCENARIOS = Path(__file__).with_name("ray_scenarios.py")
TABLE_ROWS = 30_000
TABLE = dict(batch_size=1024, placement="cpu", seed=5, shuffle_buffer=8192)  # as tests/ray_scenarios.py's
GROUP = batches_per_group(TABLE["shuffle_buffer"], TABLE["batch_size"])  # batches a side makes at a time


def _namespace_prefix() -> list[str]:
    """The command prefix for a namespace with only ``lo`` up, or a skip saying why there cannot be one."""
    if shutil.which("unshare") is None:
        pytest.skip("Ray tests need `unshare` (util-linux) for a loopback-only network namespace")
    for prefix in (["unshare", "-n"], ["unshare", "-rn"]):
        probe = subprocess.run([*prefix, "sh", "-c", "ip link set lo up 2>/dev/null || ifconfig lo up"],
                               capture_output=True, text=True)
        if probe.returncode == 0:
            return prefix
    pytest.skip(f"Ray tests need a private network namespace and `unshare` is not permitted here: "
                f"{probe.stderr.strip()}")


_reports: dict = {}  # the scenarios' report, once a session: test_valid_remote.py reads it too


def scenarios_report(tmp_path_factory) -> dict:
    """The report of tests/ray_scenarios.py, run once a session (it starts Ray, its workers, and a second cluster)."""
    if "report" not in _reports:
        _reports["report"] = _run_scenarios(tmp_path_factory)
    return _reports["report"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return scenarios_report(tmp_path_factory)


def _run_scenarios(tmp_path_factory) -> dict:
    prefix = _namespace_prefix()
    data = tmp_path_factory.mktemp("remote")
    write_images(data / "images", 37, classes=3)
    # Sample 5 in the source's order (class_0/img_0010.jpg): in batch 1, the first one the deal sends a worker.
    bad = write_images(data / "bad_images", 14, classes=2, seed=5)[10]
    bad.write_bytes(b"this is not an image")
    make_criteo(data / "criteo.tsv", rows=3000, seed=0)
    tables = data / "tables"
    tables.mkdir()
    make_criteo(tables / "big.tsv", rows=TABLE_ROWS, seed=4)  # 7 chunks of text, buffer-fulls of 2
    convert(criteo(str(tables / "big.tsv")).source, tables / "conv")
    # Bad rows in the second batch of the first group a worker makes (the first group is made locally), and in
    # batches 20 and 27 of the first epoch.
    plans = list(Loader(criteo(str(tables / "big.tsv")), **TABLE).sampler.epoch(0))
    bad_lines = [int(plans[GROUP + 1].indices[1]) + 1, int(plans[20].indices[5]) + 1, int(plans[27].indices[3]) + 1]
    lines = (tables / "big.tsv").read_text().splitlines(keepends=True)
    for line in bad_lines:
        lines[line - 1] = "x" + lines[line - 1]  # the label is no longer a number
    (tables / "bad.tsv").write_text("".join(lines))
    valid = data / "valid"  # for tests/test_valid_remote.py
    not_an_image = write_images(valid / "images", 10, classes=2, seed=5)[3]
    not_an_image.write_bytes(b"not an image")
    make_criteo(valid / "criteo.tsv", rows=300, seed=0)
    out = data / "report.json"
    script = f'ip link set lo up 2>/dev/null || ifconfig lo up; exec "$0" "$1" "$2" "$3"'
    run = subprocess.run([*prefix, "sh", "-c", script, sys.executable, str(SCENARIOS), str(data), str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    report = json.loads(out.read_text())
    report["data"] = str(data)
    report["bad_lines"] = bad_lines
    report["bad_index"] = sorted(str(p) for p in (data / "bad_images").rglob("*.jpg")).index(str(bad))
    report["bad_path"] = str(bad)
    report["image_files"] = sorted(str(p) for p in (data / "images").rglob("*.jpg"))  # in the source's order
    report["valid"]["not_an_image"] = sorted(str(p) for p in (valid / "images").rglob("*.jpg")).index(
        str(not_an_image))
    return report


def test_image_batches_equal_the_local_loaders(report):
    assert report["remote_batches"] > 0
    assert report["images_remote"] == report["images_local"]
    assert len(report["images_local"]) == 2 * 10  # 37 images, batches of 4, two epochs


def test_writing_to_a_batch_changes_no_other(report):
    assert report["after_writes"] == report["images_local_epochs_3_4"]


def test_criteo_batches_equal_the_local_loaders(report):
    assert report["criteo_remote"] == report["criteo_local"]
    assert len(report["criteo_local"]) == 2 * 12  # 3000 rows, batches of 256


def test_table_batches_equal_the_local_loaders_when_workers_make_whole_buffer_fulls(report):
    for name, local in (("tsv", report["table_local"][:60]), ("converted", report["table_converted_local"])):
        assert len(local) == 2 * 30  # 30,000 rows, batches of 1024, two epochs
        assert report[f"table_{name}"] == local, name
        assert 0 < report[f"table_{name}_remote_batches"] < 60, name  # both sides made buffer-fulls


def test_writing_to_a_table_batch_changes_no_other(report):
    assert report["table_after_writes"] == report["table_local"][90:]


def test_bad_rows_are_invalid_slots_and_listed_once_with_remote_workers(report):
    local, remote, local_listed, remote_listed = report["table_skip"]
    assert remote == local
    path = str(Path(report["data"], "tables", "bad.tsv"))
    assert sorted(remote_listed) == sorted(local_listed) == sorted(f"{path}:{line}" for line in report["bad_lines"])


def test_a_bad_row_in_a_workers_buffer_full_raises_after_the_batches_before_it(report):
    local, remote = report["table_raise"]
    where = f"{Path(report['data'], 'tables', 'bad.tsv')}:{report['bad_lines'][0]}"
    assert len(local["delivered"]) == GROUP + 1 and remote["delivered"] == local["delivered"]
    assert remote["remote_batches"] == 1  # the batch before came from the worker that met the bad row after it
    for side in (local, remote):
        assert side["error"] == "RowError" and where in side["message"], side


def test_a_table_resumes_mid_buffer_full_with_remote_workers(report):
    assert report["table_resumed"] == report["table_local"][:60]


def test_a_worker_killed_mid_buffer_full_is_restarted_and_nothing_is_lost_or_repeated(report):
    got, busy, before, after = report["table_killed"]
    assert busy > 0  # it had buffer-fulls to make when it was killed
    assert before != after
    assert got == report["table_local"][:60]


def test_a_worker_killed_mid_epoch_loses_and_repeats_nothing(report):
    before, after = report["killed_pids"]
    assert before != after  # Ray restarted the actor
    assert report["killed"] == report["images_local"]


def test_train_and_val_loaders_given_one_rayworkers_share_one_set_of_workers(report):
    # The cluster has room for one set of workers (2 CPUs, 2 workers of 1): both Loaders run, in turn, on it.
    train_0, val_0, train_1, val_1 = report["shared_turns"]
    assert train_0 + train_1 == report["images_local"]
    assert val_0 == val_1 == report["shared_val_local"] and len(val_0) == 10
    train_actors, val_actors = report["shared_actors"]
    assert train_actors == val_actors and len(train_actors) == 2
    assert report["free_after_one_closed"] == 0  # the val Loader still holds them
    assert report["free_after_both_closed"] == 2  # the last Loader closed ends them


def test_workers_without_room_fail_within_start_timeout(report):
    message, seconds = report["no_room"]
    assert "1 of 1 Ray workers of 2 CPU(s) did not start within 2 s (RayWorkers.start_timeout_s)" in message
    assert "0 free CPUs" in message
    assert seconds < 30


def test_a_plan_that_kills_its_worker_ends_in_an_error_naming_its_samples(report):
    from feedline.loader.runners.remote import MAX_PLAN_RETRIES

    crash = report["crash"]
    assert crash is not None and crash["type"] == "RemoteWorkerError"
    first, second = report["crash_local"]
    assert crash["delivered"] == [first]  # one local thread made batch 0; the worker was dealt batch 1
    assert crash["deaths"] == 1 + MAX_PLAN_RETRIES
    message, files = crash["message"], report["image_files"]
    assert message.startswith("Ray worker 1 of 1 (actor ")
    assert (f"failed making batch 1 of epoch 0 (samples {second[0]}, {second[1]}, {second[2]} and 1 more: "
            f"{files[second[0]]}, {files[second[1]]}, {files[second[2]]}, ...)") in message
    assert f"at most MAX_PLAN_RETRIES={MAX_PLAN_RETRIES} times" in message
    assert re.search(r"Ray's error: Actor(Unavailable|Died)Error: The actor \w+ ", message), message


def test_a_late_batch_is_logged_naming_the_worker_and_the_plan(report):
    assert report["stall_batches"] == report["stall_local"]  # late, not lost
    lines, second = report["stall_lines"], report["crash_local"][1]  # the same order: batch 1's samples
    # The worker's first batch is 2.5 s late, logged every 0.5 s.
    assert 2 <= len(lines) <= 6, lines
    for line in lines:
        assert line.startswith("feedline: Ray worker 1 of 1 (actor ")
        assert f"has not returned batch 1 of epoch 0 (samples {second[0]}, {second[1]}, {second[2]} and 1 more" in line
        assert "the Loader gives up at 60 s (RayWorkers.batch_timeout_s)" in line
    waited = [float(re.search(r" for ([0-9.]+) s;", line).group(1)) for line in lines]
    assert all(w >= 0.5 * (k + 1) - 0.05 for k, w in enumerate(waited)), waited


def test_a_batch_later_than_batch_timeout_raises_and_restarts_its_worker(report):
    hang, second = report["hang"], report["crash_local"][1]
    assert hang is not None, "the Loader waited for the stalled worker"
    assert hang["message"].startswith("Ray worker 1 of 1 (actor ")
    assert f"did not return batch 1 of epoch 0 (samples {second[0]}, " in hang["message"]
    assert "within 3 s (RayWorkers.batch_timeout_s=3); the worker was restarted" in hang["message"]
    assert hang["seconds"] < 60  # the stage would have slept 120 s
    before, after = hang["pids"]
    assert before != after


def test_resume_from_a_state_saved_with_remote_workers(report):
    assert report["resumed"] == report["images_local"]


def test_skips_made_by_workers_land_in_loader_skipped(report):
    bad = report["bad_index"]
    assert sorted(report["skip_valid"]) == [i for i in range(14) if i != bad]
    assert report["skip_listed"] == [report["bad_path"]]
    assert report["skip_listed_locally"] == []  # a worker met it, not the local runner
    planned, made = report["skip_len"]
    assert planned == made == 4


def test_two_ranks_each_with_its_own_workers(report):
    ranks = report["ranks"]
    assert all(r["equal"] for r in ranks)
    union = sorted(i for r in ranks for i in r["valid"])
    assert union == list(range(37))


def test_auto_adds_no_workers_on_the_trainers_own_machine(report):
    batches, remote = report["auto_single_node"]
    assert batches == report["images_local"][:10]
    assert remote["used_workers"] == 0 and "another machine" in remote["why"]


def test_auto_adds_workers_on_another_node_where_the_cpu_limits(report):
    batches, remote, remote_batches = report["auto_two_nodes"]
    assert batches == report["images_local"][:10]
    assert remote["used_workers"] == 2 and remote["why"].startswith("used: the plan is bound by the CPU")
    assert remote["receive_seconds"] > 0 and remote["predicted_samples_per_s"] > remote["predicted_local_samples_per_s"]
    assert remote_batches > 0


def test_ray_uses_loopback_only(report):
    assert report["sockets"], "no sockets of Ray's processes were seen"
    # A socket listening on every address (0.0.0.0, ::) is reached on loopback only where there is no other link.
    assert set(report["interfaces"]) == {"lo"}, report["interfaces"]
    for local, remote, status in report["sockets"]:
        for address in (local, remote):
            if address is None:
                continue
            ip = ipaddress.ip_address(address)
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
                ip = ip.ipv4_mapped
            assert ip.is_loopback or (ip.is_unspecified and status == "LISTEN"), (local, remote, status)


def test_an_unreachable_cluster_is_named_at_once(report):
    message, seconds = report["unreachable"]
    assert "127.0.0.1:9" in message
    assert seconds < 30


def test_worker_arguments_are_checked():
    with pytest.raises(ValueError, match="num_workers must be a positive integer"):
        RayWorkers(num_workers=0)
    with pytest.raises(ValueError, match="cpus_per_worker"):
        RayWorkers(cpus_per_worker=1.5)
    with pytest.raises(ValueError, match="address"):
        RayWorkers(address="")


@pytest.mark.parametrize("name,value", [("start_timeout_s", 0), ("batch_timeout_s", float("inf")),
                                        ("batch_timeout_s", float("nan")), ("stall_warning_s", -1.0),
                                        ("stall_warning_s", True), ("start_timeout_s", "60")])
def test_worker_bounds_are_checked(name, value):
    with pytest.raises(ValueError, match=f"RayWorkers.{name} must be a positive, finite number of seconds, "
                                         f"got {re.escape(repr(value))}"):
        RayWorkers(**{name: value})


def test_a_stall_warning_after_the_timeout_is_refused():
    with pytest.raises(ValueError, match=r"stall_warning_s \(30\) must not exceed batch_timeout_s \(10\)"):
        RayWorkers(stall_warning_s=30, batch_timeout_s=10)
    assert RayWorkers(stall_warning_s=10, batch_timeout_s=10).batch_timeout_s == 10.0


def test_loader_arguments_for_remote_workers_are_checked(image_dir, monkeypatch):
    from feedline.loader import Loader, PlacementError
    from feedline.pipelines import image

    spec = image.train(image_dir, size=32)
    with pytest.raises(TypeError, match="remote must be a feedline.loader.RayWorkers, got dict"):
        Loader(spec, batch_size=4, placement="cpu", remote={"num_workers": 2})
    # As on a GPU machine, where placement="gpu" resolves: the workers cannot run its GPU stages.
    monkeypatch.setattr("feedline.loader.placement.controller.gpu_available", lambda: True)
    with pytest.raises(PlacementError, match="remote workers run the CPU placement of a pipeline; placement 'gpu'"):
        Loader(spec, batch_size=4, placement="gpu", remote=RayWorkers())
    monkeypatch.undo()
    with pytest.raises(ValueError, match=r"Ray address must be 'host:port'.*got 'headnode'"):
        Loader(spec, batch_size=4, placement="cpu", remote=RayWorkers(address="headnode"))
