"""A dressed buffer (its NumPy views and delivered torch views made once) goes back into rotation only when
nobody holds the buffer, any of its views or tensors, or a view of its storage; a CPU batch is then the
buffer's own tensors, and equals a copy of what was written."""
from __future__ import annotations

import threading

import numpy as np
import torch

from feedline.loader.runners.buffers import BufferRing, Dressed
from feedline.loader.runners.feature_buffers import BufferLayout

LAYOUT = BufferLayout({"a": ((100,), np.dtype(np.float32)), "b": ((10, 5), np.dtype(np.int64)),
                       "c": ((7,), np.dtype(np.bool_))})


def dress(tensor):
    array = tensor.numpy()
    return Dressed(tensor, array, LAYOUT.views(array), LAYOUT.torch_views(tensor))


def take(ring):
    return ring.dressed((LAYOUT.nbytes,), torch.uint8, dress)[0]  # (the dict of views taken is let go)


def test_views_and_tensors_share_the_buffer():
    d = take(BufferRing(2))
    d.views["a"][:] = np.arange(100, dtype=np.float32)
    d.views["b"][:] = np.arange(50).reshape(10, 5)
    d.views["c"][:] = [True, False] * 3 + [True]
    assert torch.equal(d.tensors["a"], torch.arange(100, dtype=torch.float32))
    assert torch.equal(d.tensors["b"], torch.arange(50).reshape(10, 5))
    assert d.tensors["c"].dtype == torch.bool and d.tensors["c"].tolist() == [True, False] * 3 + [True]
    for name in LAYOUT.places:
        assert d.tensors[name].data_ptr() == d.views[name].ctypes.data


HOLDERS = {
    "a delivered tensor": lambda d: d.tensors["a"],
    "a NumPy view": lambda d: d.views["b"],
    "a view of a delivered tensor": lambda d: d.tensors["b"][2:4],
    "a view of a NumPy view": lambda d: d.views["c"][1:],
    "the buffer tensor": lambda d: d.tensor,
    "the buffer's NumPy array": lambda d: d.array,
    "a view of the buffer's NumPy array": lambda d: d.array[8:],
    "a delivered tensor's NumPy array": lambda d: d.tensors["c"].numpy(),
}


def test_reused_only_once_nothing_holds_it():
    ring = BufferRing(4)
    first = take(ring)
    for what, hold in HOLDERS.items():
        held = hold(first)
        assert not first.free(), what
        others = [take(ring) for _ in range(3)]
        assert all(other is not first for other in others), what
        del others
        del held
        assert first.free(), what
        assert first in [take(ring) for _ in range(4)], what  # (each taken in turn, none held)
    assert ring.reused >= len(HOLDERS)


def test_a_held_batch_is_never_written_again_across_threads():
    ring = BufferRing(8)
    wrong = []

    def work(k):
        kept = []
        for i in range(300):
            d, views = ring.dressed((LAYOUT.nbytes,), torch.uint8, dress)
            views["a"][:] = k * 1000 + i
            kept.append((k * 1000 + i, d.tensors["a"]))  # delivered: the views are let go, the tensor is held
            del d, views
            if len(kept) > 3:
                del kept[0]
            wrong.extend(value for value, tensor in kept if not bool((tensor == value).all()))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
    assert ring.reused > 0


def test_a_buffer_is_taken_while_its_views_dict_is_held():
    ring = BufferRing(4)
    first, views = ring.dressed((LAYOUT.nbytes,), torch.uint8, dress)
    assert not first.free()  # (between the ring's lock and the batch's arrays: no other thread may take it)
    assert ring.dressed((LAYOUT.nbytes,), torch.uint8, dress)[0] is not first
    del views
    assert first.free()

