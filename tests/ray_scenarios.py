"""Remote workers on a local Ray cluster, every scenario in one process (one cluster start), run by
tests/test_remote.py inside a network namespace where only loopback is up. Writes a JSON report.

python ray_scenarios.py DATA_DIR OUT_JSON
"""
import hashlib
import json
import sys
import time
from pathlib import Path

import psutil
import torch

from feedline.loader import Loader, RayWorkers
from feedline.pipelines import image
from feedline.pipelines.criteo import criteo


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


def main(data: str, out: str) -> None:
    import ray

    report = {}
    images, bad_images, table = Path(data, "images"), Path(data, "bad_images"), Path(data, "criteo.tsv")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    workers = RayWorkers(num_workers=2)

    spec = image.train(images, size=48)
    local = Loader(spec, batch_size=4, placement="cpu", seed=3)
    remote = Loader(spec, batch_size=4, placement="cpu", seed=3, remote=workers)
    report["images_local"], report["images_remote"] = epochs(local), epochs(remote)
    report["images_local_epochs_3_4"] = epochs(local, 2)[10:]
    report["remote_batches"] = remote._runner.remote_batches
    for batch in remote:  # a trainer may write to its batches (views of the object store) ...
        batch["image"].mul_(0)
    report["after_writes"] = epochs(remote, 1)  # ... without changing the next ones
    report["sockets"] = sockets_of_ray()
    report["interfaces"] = sorted(psutil.net_if_addrs())
    remote.close()

    table_spec = criteo(str(table))
    report["criteo_local"] = epochs(Loader(table_spec, batch_size=256, placement="cpu", seed=1))
    with_remote = Loader(table_spec, batch_size=256, placement="cpu", seed=1, remote=workers)
    report["criteo_remote"] = epochs(with_remote)
    with_remote.close()

    # A worker killed mid-epoch: Ray restarts it and runs its plans again.
    killed = Loader(spec, batch_size=4, placement="cpu", seed=3, remote=workers)
    got, it = [], iter(killed)
    for _ in range(3):
        got.append(digest(next(it)))
    victim = killed._runner.actors[0]
    pid_before = ray.get(victim.pid.remote())
    ray.kill(victim, no_restart=False)
    got += [digest(b) for b in it] + [digest(b) for b in killed]
    report["killed"] = got
    report["killed_pids"] = [pid_before, ray.get(victim.pid.remote())]
    killed.close()

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

    # Skips reported by workers land in loader.skipped; every good sample arrives once.
    skipping = Loader(image.val(bad_images, size=32), batch_size=4, placement="cpu", on_error="skip",
                      remote=workers, shuffle=False)
    valid = []
    for b in skipping:
        mask = b.get("valid", torch.ones(len(b["index"]), dtype=torch.bool))
        valid += b["index"][mask].tolist()
    report["skip_valid"] = valid
    report["skip_listed"] = [s.where for s in skipping.skipped]
    report["skip_len"] = [len(skipping), skipping.epoch_summaries[0]["batches"]]
    skipping.close()

    # Two ranks, each with workers of its own: together every sample once, each as its local counterpart.
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
    # placement="auto": the only node is this machine, so workers there would take the local threads' cores.
    auto = Loader(spec, batch_size=4, placement="auto", seed=3, remote=workers)
    report["auto_single_node"] = [epochs(auto, 1), auto.plan["remote"]]
    auto.close()
    report["sockets"] += sockets_of_ray()
    ray.shutdown()

    # A second node (Ray's own test cluster: another raylet on this machine) has room: auto adds workers there.
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    auto = Loader(spec, batch_size=4, placement="auto", seed=3, remote=workers)
    report["auto_two_nodes"] = [epochs(auto, 1), auto.plan["remote"], auto._runner.remote_batches]
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
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:3])
