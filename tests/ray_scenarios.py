"""Remote workers on a local Ray cluster, every scenario in one process (one cluster start), run by
tests/test_remote.py inside a network namespace where only loopback is up (tests/test_valid_remote.py reads the
same report). Writes a JSON report.

python ray_scenarios.py DATA_DIR OUT_JSON
"""
import hashlib
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch

from feedline.loader import Loader, RayWorkers
from feedline.pipelines import image
from feedline.pipelines.criteo import criteo

import valid_remote_scenario


def digest(batch) -> str:
    h = hashlib.sha256()
    for key in sorted(batch):
        value = batch[key]
        if isinstance(value, dict):
            value = {k: v for k, v in value.items() if isinstance(v, torch.Tensor)}
            for k in sorted(value):
                h.update(value[k].contiguous().numpy().tobytes())
        else:
            h.update(value.contiguous().numpy().tobytes())
    return h.hexdigest()[:20]


def epochs(loader, n=2):
    return [digest(b) for _ in range(n) for b in loader]


TRAINER = os.getpid()  # baked into the stages below when they are sent to the workers


def crash_in_workers(deaths: str):
    """A custom stage that ends the process it runs in, as a native crash would (no Python error), in the
    workers only; each death is a line of ``deaths``."""
    def crash(images):
        if os.getpid() != TRAINER:
            with open(deaths, "a") as f:
                f.write(f"{os.getpid()}\n")
            os._exit(7)
        return images
    return crash


def stall_once_in_workers(marker: str, seconds: float):
    """A custom stage that sleeps ``seconds`` the first time a worker runs it (``marker`` says it has)."""
    def stall(images):
        if os.getpid() != TRAINER:
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return images
            time.sleep(seconds)
        return images
    return stall


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def indices(loader, n=None):
    out = []
    for b in loader:
        out.append(b["index"].tolist())
    return out


def free_cpus(ray, want: float, within_s: float = 20.0) -> float:
    """The cluster's free CPUs once they reach ``want`` (killed actors give theirs back asynchronously)."""
    deadline = time.monotonic() + within_s
    while (free := ray.available_resources().get("CPU", 0)) < want and time.monotonic() < deadline:
        time.sleep(0.2)
    return free


def sockets_of_ray() -> list:
    """Every inet socket of this process and its children (Ray's GCS, raylet, workers): (laddr, raddr, status)."""
    me = psutil.Process()
    out = []
    for proc in [me, *me.children(recursive=True)]:
        try:
            for c in proc.net_connections(kind="inet"):
                out.append((c.laddr.ip if c.laddr else None, c.raddr.ip if c.raddr else None, c.status))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


TABLE = dict(batch_size=1024, placement="cpu", seed=5, shuffle_buffer=8192)  # buffer-fulls of 8 batches


def tables(report: dict, folder: Path, workers) -> None:
    """Streamed tables dealt a shuffle buffer-full at a time: equal to the local loader's batches (a TSV and a
    converted table, two epochs), bad rows skipped, a resume mid buffer-full, a worker killed mid buffer-full."""
    import ray

    big = criteo(str(folder / "big.tsv"))
    local = Loader(big, **TABLE)
    report["table_local"] = epochs(local, 4)
    report["table_converted_local"] = epochs(Loader(criteo(str(folder / "conv")), **TABLE))
    for name, spec in (("tsv", big), ("converted", criteo(str(folder / "conv")))):
        remote = Loader(spec, remote=workers, **TABLE)
        report[f"table_{name}"] = epochs(remote)
        report[f"table_{name}_remote_batches"] = remote.runner.remote_batches
        if name == "tsv":
            for batch in remote:  # a trainer may write to its batches without changing the next ones
                batch["dense"].mul_(0)
                batch["sparse"]["values"].mul_(0)
            report["table_after_writes"] = epochs(remote, 1)
            report["table_share"] = remote.runner.local_share
        remote.close()

    bad = criteo(str(folder / "bad.tsv"), on_error="skip")
    local, remote = Loader(bad, **TABLE), Loader(bad, remote=workers, **TABLE)
    report["table_skip"] = [epochs(local), epochs(remote), [s.where for s in local.skipped],
                            [s.where for s in remote.skipped]]
    remote.close()

    raising = []  # the first bad row is in the second batch of the first group dealt to a worker
    for loader in (Loader(criteo(str(folder / "bad.tsv")), **TABLE),
                   Loader(criteo(str(folder / "bad.tsv")), remote=workers, **TABLE)):
        delivered = []
        try:
            for batch in loader:
                delivered.append(digest(batch))
            raising.append({"delivered": delivered, "error": None})
        except Exception as e:
            raising.append({"delivered": delivered, "error": next(c.__name__ for c in type(e).__mro__
                                                                  if c.__module__.startswith("feedline")),
                            "message": str(e), "remote_batches": getattr(loader.runner, "remote_batches", 0)})
        loader.close()
    report["table_raise"] = raising

    first = Loader(big, remote=workers, **TABLE)  # resumed mid buffer-full: 11 batches are one and 3/8
    it = iter(first)
    head = [digest(next(it)) for _ in range(11)]
    state = first.state_dict()
    first.close()
    second = Loader(big, remote=workers, **TABLE)
    second.load_state_dict(state)
    report["table_resumed"] = head + [digest(b) for b in second] + [digest(b) for b in second]
    second.close()

    killed = Loader(big, remote=workers, **TABLE)
    it = iter(killed)
    got = [digest(next(it))]
    runner = killed.runner
    pid_before, busy = runner.team[0].pid, runner.deal.working(0)  # groups the worker has not finished
    ray.kill(runner.actors[0], no_restart=False)
    got += [digest(b) for b in it] + [digest(b) for b in killed]
    report["table_killed"] = [got, busy, pid_before, ray.get(runner.actors[0].pid.remote(), timeout=60)]
    killed.close()


def main(data: str, out: str) -> None:
    import ray

    report = {"seconds": {}}
    last = [time.perf_counter()]

    def lap(name: str) -> None:  # the seconds the part just ended took (to keep them cheap)
        now = time.perf_counter()
        report["seconds"][name] = round(now - last[0], 1)
        last[0] = now
    images, bad_images, table = Path(data, "images"), Path(data, "bad_images"), Path(data, "criteo.tsv")
    # A new cluster, whatever /tmp/ray/ray_current_cluster names (a cluster that ended without removing it).
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    workers = RayWorkers(num_workers=2)

    spec = image.train(images, size=48)
    local = Loader(spec, batch_size=4, placement="cpu", seed=3)
    remote = Loader(spec, batch_size=4, placement="cpu", seed=3, remote=workers)
    report["images_local"], report["images_remote"] = epochs(local), epochs(remote)
    report["images_local_epochs_3_4"] = epochs(local, 2)[10:]
    report["remote_batches"] = remote.runner.remote_batches
    for batch in remote:  # a trainer may write to its batches (views of the object store) ...
        batch["image"].mul_(0)
    report["after_writes"] = epochs(remote, 1)  # ... without changing the next ones
    report["sockets"] = sockets_of_ray()
    report["interfaces"] = sorted(psutil.net_if_addrs())
    # ``remote`` stays open until the shared scenario: every Loader given ``workers`` (or RayWorkers of the same
    # shape) meanwhile runs on its two actors, as a trainer's next Loaders would, instead of starting new ones.

    table_spec = criteo(str(table))
    report["criteo_local"] = epochs(Loader(table_spec, batch_size=256, placement="cpu", seed=1))
    with_remote = Loader(table_spec, batch_size=256, placement="cpu", seed=1, remote=workers)
    report["criteo_remote"] = epochs(with_remote)
    with_remote.close()

    lap("images_and_criteo")
    tables(report, Path(data, "tables"), workers)
    lap("tables")
    # A worker killed mid-epoch: Ray restarts it and runs its plans again.
    killed = Loader(spec, batch_size=4, placement="cpu", seed=3, remote=workers)
    got, it = [], iter(killed)
    for _ in range(3):
        got.append(digest(next(it)))
    victim = killed.runner.actors[0]
    pid_before = ray.get(victim.pid.remote())
    ray.kill(victim, no_restart=False)
    got += [digest(b) for b in it] + [digest(b) for b in killed]
    report["killed"] = got
    report["killed_pids"] = [pid_before, ray.get(victim.pid.remote())]
    killed.close()

    lap("killed")
    # Resume mid-epoch from a state saved by a loader with remote workers.
    first = Loader(spec, batch_size=4, placement="cpu", seed=3, remote=workers)
    it = iter(first)
    head = [digest(next(it)) for _ in range(4)]
    state = first.state_dict()
    first.close()
    second = Loader(spec, batch_size=4, placement="cpu", seed=3, remote=workers)
    second.load_state_dict(state)
    report["resumed"] = head + [digest(b) for b in second] + [digest(b) for b in second]
    second.close()

    lap("resume")
    # Skips reported by workers land in loader.skipped; every good sample arrives once.
    skipping = Loader(image.val(bad_images, size=32), batch_size=4, placement="cpu", on_error="skip",
                      remote=workers, shuffle=False)
    valid = []
    for b in skipping:
        mask = b.get("valid", torch.ones(len(b["index"]), dtype=torch.bool))
        valid += b["index"][mask].tolist()
    report["skip_valid"] = valid
    report["skip_listed"] = [s.where for s in skipping.skipped]
    report["skip_listed_locally"] = [s.where for s in skipping.runner.local.skipped]
    report["skip_len"] = [len(skipping), skipping.epoch_summaries[0]["batches"]]
    skipping.close()

    lap("skips")
    # Two ranks, each with a RayWorkers of its own (in this one process, both on the pool's first actor): together
    # every sample once, each as its local counterpart.
    ranks = []
    for rank in range(2):
        mine = Loader(spec, batch_size=4, placement="cpu", seed=3, rank=rank, world_size=2,
                      remote=RayWorkers(num_workers=1))
        theirs = Loader(spec, batch_size=4, placement="cpu", seed=3, rank=rank, world_size=2)
        batches = list(mine)
        ranks.append({"equal": [digest(b) for b in batches] == [digest(b) for b in theirs],
                      "valid": [i for b in batches for i in b["index"][b.get("valid", torch.ones(
                          len(b["index"]), dtype=torch.bool))].tolist()]})
        mine.close()
    report["ranks"] = ranks
    lap("ranks")
    # placement="auto": the only node is this machine, so workers there would take the local threads' cores.
    auto = Loader(spec, batch_size=4, placement="auto", seed=3, remote=workers)
    report["auto_single_node"] = [epochs(auto, 1), auto.plan["remote"]]
    auto.close()
    lap("auto_single_node")
    report["valid"] = valid_remote_scenario.run(Path(data, "valid"), RayWorkers(num_workers=1))  # test_valid_remote
    lap("valid")
    # A train and a val Loader given one RayWorkers, used in turn, on a cluster with room for one set of workers
    # (``remote``'s, which then closes: they alone hold it).
    shared = RayWorkers(num_workers=2, start_timeout_s=30)
    val_spec = image.val(images, size=32)
    train = Loader(spec, batch_size=4, placement="cpu", seed=3, remote=shared)
    val = Loader(val_spec, batch_size=4, placement="cpu", shuffle=False, remote=shared)
    remote.close()
    report["shared_turns"] = [epochs(train, 1), epochs(val, 1), epochs(train, 1), epochs(val, 1)]
    report["shared_val_local"] = epochs(Loader(val_spec, batch_size=4, placement="cpu", shuffle=False), 1)
    report["shared_actors"] = [sorted(w.actor_id for w in loader.runner.team) for loader in (train, val)]
    started = time.perf_counter()  # workers of another shape, with no room left for them: a bounded wait
    try:
        Loader(spec, batch_size=4, placement="cpu", remote=RayWorkers(cpus_per_worker=2, start_timeout_s=2))
        report["no_room"] = None
    except TimeoutError as e:
        report["no_room"] = [str(e), time.perf_counter() - started]
    train.close()
    report["free_after_one_closed"] = ray.available_resources().get("CPU", 0)
    # val stays open, holding the workers, through the three scenarios below: they share its actors.

    lap("shared")
    # A plan that kills its worker every time: an error naming the plan after a bounded number of tries.
    scratch = Path(tempfile.mkdtemp(prefix="ray-scenarios-"))
    crash_spec = image.pipeline(images, [image.decode(), image.resize((32, 32)),
                                         image.custom(crash_in_workers(str(scratch / "deaths")))])
    report["crash_local"] = indices(Loader(crash_spec, batch_size=4, placement="cpu", seed=3))[:2]
    crashing = Loader(crash_spec, batch_size=4, placement="cpu", seed=3, num_threads=1,
                      remote=RayWorkers(num_workers=1))
    delivered, started = [], time.perf_counter()
    try:
        for b in crashing:
            delivered.append(b["index"].tolist())
        report["crash"] = None
    except Exception as e:
        report["crash"] = {"type": type(e).__name__, "message": str(e), "delivered": delivered,
                           "seconds": time.perf_counter() - started,
                           "deaths": len((scratch / "deaths").read_text().split())}
    crashing.close()

    lap("crash")
    # A worker late with a batch: logged (logger "feedline", WARNING) at the interval, and the batch still arrives.
    lines = Lines()
    logging.getLogger("feedline").addHandler(lines)
    stall_spec = image.pipeline(images, [image.decode(), image.resize((32, 32)),
                                         image.custom(stall_once_in_workers(str(scratch / "stall"), 2.5))])
    stalling = Loader(stall_spec, batch_size=4, placement="cpu", seed=3, num_threads=1,
                      remote=RayWorkers(num_workers=1, stall_warning_s=0.5, batch_timeout_s=60))
    report["stall_batches"] = epochs(stalling, 1)
    report["stall_local"] = epochs(Loader(stall_spec, batch_size=4, placement="cpu", seed=3), 1)
    report["stall_lines"] = [line for line in lines.lines if "has not returned" in line]
    stalling.close()

    lap("stall")
    # A worker later than batch_timeout_s: the Loader raises, naming worker and plan, and the worker is restarted.
    hang_spec = image.pipeline(images, [image.decode(), image.resize((32, 32)),
                                        image.custom(stall_once_in_workers(str(scratch / "hang"), 120))])
    hanging = Loader(hang_spec, batch_size=4, placement="cpu", seed=3, num_threads=1,
                     remote=RayWorkers(num_workers=1, stall_warning_s=0.5, batch_timeout_s=3))
    pid_before, started = hanging.runner.team[0].pid, time.perf_counter()
    try:
        epochs(hanging, 1)
        report["hang"] = None
    except TimeoutError as e:
        report["hang"] = {"message": str(e), "seconds": time.perf_counter() - started,
                          "pids": [pid_before, ray.get(hanging.runner.actors[0].pid.remote(), timeout=60)]}
    hanging.close()
    logging.getLogger("feedline").removeHandler(lines)
    val.close()
    report["free_after_both_closed"] = free_cpus(ray, 2)
    report["sockets"] += sockets_of_ray()
    ray.shutdown()

    lap("hang_and_shutdown")
    # A second node (Ray's own test cluster: another raylet on this machine) has room: auto adds workers there.
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    auto = Loader(spec, batch_size=4, placement="auto", seed=3, remote=workers)
    report["auto_two_nodes"] = [epochs(auto, 1), auto.plan["remote"], auto.runner.remote_batches]
    auto.close()
    report["sockets"] += sockets_of_ray()
    ray.shutdown()
    cluster.shutdown()

    started = time.perf_counter()
    try:
        Loader(spec, batch_size=4, placement="cpu", remote=RayWorkers(address="127.0.0.1:9"))
        report["unreachable"] = None
    except ConnectionError as e:
        report["unreachable"] = [str(e), time.perf_counter() - started]
    lap("auto_two_nodes_and_unreachable")
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:3])
