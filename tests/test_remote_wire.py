"""How a worker's group of batches crosses to the trainer, without Ray: as NumPy arrays pickled with protocol 5
(out-of-band buffers, as Ray sends them), the memory every batch of a size shares sent once a group; and a worker
pinned to its cores with all its threads (loader/runners/remote_workers.py, remote.py)."""
import os
import pickle
import threading
import warnings

import pytest
import torch

from feedline.datagen.synthetic_criteo import make_criteo
from feedline.loader import Loader
from feedline.loader.runners import remote
from feedline.loader.runners.remote_workers import Maker, as_arrays
from feedline.pipelines.criteo import criteo


def out_of_band(value) -> tuple[bytes, list[pickle.PickleBuffer]]:
    buffers: list[pickle.PickleBuffer] = []
    return pickle.dumps(value, protocol=5, buffer_callback=buffers.append), buffers


def leaves(batch: dict) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in batch.items():
        if isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in value.items() if isinstance(v, torch.Tensor)})
        elif isinstance(value, torch.Tensor):
            out[key] = value
    return out


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    """Three consecutive Criteo batches of a local CPU loader, held at once, as a worker's group holds them."""
    path = tmp_path_factory.mktemp("wire") / "criteo.tsv"
    make_criteo(path, rows=2000, seed=3)
    loader = Loader(criteo(str(path)), batch_size=256, placement="cpu", seed=2)
    stream = iter(loader)
    batches = [next(stream) for _ in range(3)]
    stream.close()
    return batches


def test_the_outputs_every_batch_shares_cross_once_a_group(group):
    each = [{k: v.numpy() for k, v in leaves(batch).items()} for batch in group]
    shared_names = {"sparse.lengths", "sparse.offsets"}
    for name in shared_names:  # (what the local runner makes once per batch size)
        assert len({a[name].__array_interface__["data"][0] for a in each}) == 1
    own = sum(a.nbytes for arrays in each for name, a in arrays.items() if name not in shared_names)
    shared_bytes = sum(each[0][name].nbytes for name in shared_names)

    data, buffers = out_of_band([as_arrays(batch, {}) for batch in group])  # a dict per batch: nothing shared
    assert sum(b.raw().nbytes for b in buffers) == own + 3 * shared_bytes
    shared: dict = {}
    data, buffers = out_of_band([as_arrays(batch, shared) for batch in group])
    assert sum(b.raw().nbytes for b in buffers) == own + shared_bytes

    received = pickle.loads(data, buffers=buffers)
    for batch, arrays in zip(group, received):
        for name, tensor in leaves(batch).items():
            head, _, tail = name.partition(".")
            got = arrays[head][tail] if tail else arrays[head]
            assert got.dtype == tensor.numpy().dtype and got.shape == tuple(tensor.shape)
            assert got.tobytes() == tensor.numpy().tobytes(), name  # bit for bit
        assert arrays["sparse"]["keys"] == batch["sparse"]["keys"]
    # The trainer's batches of a group share those outputs, as the local batches do; nothing else.
    assert received[0]["sparse"]["lengths"] is received[2]["sparse"]["lengths"]
    assert received[0]["dense"] is not received[1]["dense"]


def test_only_the_same_memory_viewed_alike_is_sent_once():
    memory = torch.arange(12, dtype=torch.int64)
    twin = memory.clone()  # equal values, other memory
    batch = {"a": memory, "b": memory.view(3, 4), "c": memory[:6], "d": memory.view(torch.float64), "e": twin,
             "again": memory}
    arrays = as_arrays(batch, {})
    assert arrays["again"] is arrays["a"]
    assert len({id(a) for a in arrays.values()}) == 5
    _, buffers = out_of_band(arrays)
    assert len(buffers) == 5
    assert as_arrays(batch)["again"] is not as_arrays(batch)["a"]  # without ``shared``, each tensor on its own


def test_a_received_batch_is_writable_without_a_warning(group):
    data, buffers = out_of_band(as_arrays(group[0], {}))
    # Copies of the memory, writable but handed out read-only, as Ray's object store does.
    readonly = [pickle.PickleBuffer(memoryview(bytearray(b.raw())).toreadonly()) for b in buffers]
    arrays = pickle.loads(data, buffers=readonly)
    assert not arrays["dense"].flags.writeable
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batch = remote._to_torch(arrays, torch.device("cpu"))
    batch["dense"].mul_(0)
    assert not batch["dense"].any() and group[0]["dense"].any()


def test_object_store_seconds_puts_a_groups_shared_outputs_once(group):
    put_bytes = []

    class Store:  # Ray's put and get, as pickle protocol 5 with out-of-band buffers
        def put(self, value):
            data, buffers = out_of_band(value)
            put_bytes.append(sum(b.raw().nbytes for b in buffers))
            return data, buffers

        def get(self, ref, timeout=None):
            return pickle.loads(ref[0], buffers=ref[1])

    remote.object_store_seconds(Store(), group[0], torch.device("cpu"), repeats=1, per_object=3)
    one_batch_copied = put_bytes[-1]
    remote.object_store_seconds(Store(), group, torch.device("cpu"), repeats=1)
    shared = sum(group[0]["sparse"][k].numpy().nbytes for k in ("lengths", "offsets"))
    assert one_batch_copied - put_bytes[-1] == 2 * shared  # three batches' worth against one


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or not os.path.isdir("/proc/self/task"),
                    reason="thread affinity is Linux's")
def test_a_worker_pins_every_thread_of_its_process():
    before = os.sched_getaffinity(0)
    core = min(before)
    started, stop = threading.Event(), threading.Event()
    seen = {}

    def other():  # a thread started before the worker, as Ray's own are
        seen["tid"] = threading.get_native_id()
        started.set()
        stop.wait()

    thread = threading.Thread(target=other)
    thread.start()
    started.wait()
    try:
        Maker(cores=(core,))
        assert os.sched_getaffinity(seen["tid"]) == {core}
        assert os.sched_getaffinity(0) == {core}
    finally:
        for tid in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(tid), before)
            except ProcessLookupError:
                pass
        stop.set()
        thread.join()
