"""Batches are made on the loader's own thread: the trainer's thread only takes finished ones, what was made
but not taken is never counted as delivered, errors cross with their context, and no thread outlives the
Loader. Proved structurally (which thread ran which code, what was ready when), never by wall-clock bounds."""
import gc
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import feedline.loader
from feedline.loader import DataError, Loader
from feedline.loader.background import THREAD_NAME, BackgroundStream
from feedline.loader.runners.image_delivery import ImageDelivery
from feedline.pipelines import image
from feedline.pipelines.criteo import criteo

from conftest import write_images


def batch_threads():
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


def wait_for(condition, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.01)


# The code that makes batches: none of it may run on the trainer's thread once the Loader's thread runs.
_LIBRARY = Path(feedline.loader.__file__).parents[1]
MAKING = tuple(str(_LIBRARY / part) + os.sep
               for part in ("loader/runners", "loader/sources", "pipelines/imaging", "ops"))
MAKING_MODULES = ("nvidia.dali", "PIL", "numba", "torch.nn", "torchvision")


def run_profiled(call):
    """``call()``, and every Python function it ran on this thread (file:name) that makes batches, and every
    C function it called from a batch-making module."""
    seen = []

    def record(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(MAKING):
            seen.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")
        elif event == "c_call" and (getattr(arg, "__module__", None) or "").startswith(MAKING_MODULES):
            seen.append(f"{arg.__module__}.{arg.__name__}")

    sys.setprofile(record)
    try:
        return call(), seen
    finally:
        sys.setprofile(None)


@pytest.fixture
def spy(monkeypatch):
    """Records, for every image batch finished, the thread that made it and when."""
    made = []
    real = ImageDelivery.batch

    def recording(self, images, host, *timer):
        batch = real(self, images, host, *timer)
        made.append((threading.current_thread().name, time.monotonic(), batch["index"].tolist()))
        return batch

    monkeypatch.setattr(ImageDelivery, "batch", recording)
    return made


def test_the_trainer_thread_only_takes_finished_batches(image_dir, spy):
    loader = Loader(image.train(image_dir, size=64), batch_size=4, placement="cpu", seed=1, prefetch=2)
    it = iter(loader)
    first = next(it)
    assert all(thread == THREAD_NAME for thread, _, _ in spy)
    # The trainer "works" (here: blocks) and the next batches are finished meanwhile, on the loader's thread.
    wait_for(lambda: loader.background.ready == 2, "two batches are ready")
    asked = time.monotonic()
    second, ran = run_profiled(lambda: next(it))
    made = {tuple(index): when for _, when, index in spy}
    assert made[tuple(second["index"].tolist())] < asked
    assert first["image"].shape == (4, 3, 64, 64)
    # Taking a finished batch runs none of the reading, decoding or resizing on the trainer's thread.
    assert ran == []
    loader.close()


def test_the_trainer_thread_runs_no_batch_making_code_over_an_epoch(image_dir):
    """Over a whole epoch, the batch thread does all the reading, decoding, resizing and normalising; the
    trainer's thread only takes batches (the first one waits for the pipeline to start)."""
    loader = Loader(image.train(image_dir, size=96), batch_size=4, placement="cpu", seed=2)
    it = iter(loader)
    next(it)
    batches, ran = run_profiled(lambda: [b["index"].tolist() for b in it])
    assert len(batches) == 9  # 37 images in batches of 4, after the first
    assert ran == []
    loader.close()


def test_the_profiler_sees_batch_making_code_where_it_runs(image_dir):
    """The check above can fail: the same profiler, on a thread that makes a batch itself, sees the code."""
    from runners import image_runner
    from feedline.loader.sampler import EpochSampler

    runner = image_runner(image.train(image_dir, size=32), batch_size=4, seed=1)
    plans = EpochSampler(len(runner.source), 4, seed=1).epoch(0)
    (batch, _), ran = run_profiled(lambda: next(runner.batches(iter(plans))))
    assert len(batch["index"]) == 4
    assert any("loader/runners/image_" in name for name in ran)
    runner.close()


def test_made_but_not_taken_is_not_delivered(image_dir, spy):
    spec = image.train(image_dir, size=32, output="uint8")
    reference = [b["index"].tolist() for b in Loader(spec, batch_size=4, placement="cpu", seed=9)]
    spy.clear()
    loader = Loader(spec, batch_size=4, placement="cpu", seed=9, prefetch=3)
    it = iter(loader)
    taken = [next(it)["index"].tolist() for _ in range(2)]
    wait_for(lambda: len(spy) >= 5, "three more batches are made")
    state = loader.state_dict()
    assert state["position"] == 2
    resumed = Loader(spec, batch_size=4, placement="cpu", seed=9)
    resumed.load_state_dict(state)
    assert taken + [b["index"].tolist() for b in resumed] == reference
    # Breaking out and iterating again starts the next epoch; the batches made ahead are dropped, not delivered.
    again = [b["index"].tolist() for b in loader]
    assert sorted(i for b in again for i in b) == list(range(37)) and loader.epoch == 1
    loader.close()


def test_an_error_on_the_batch_thread_reaches_the_trainer_with_its_context(tmp_path):
    paths = write_images(tmp_path, 6, classes=1)
    loader = Loader(image.val(tmp_path, size=32), batch_size=2, shuffle=False, placement="cpu")
    paths[3].write_bytes(b"not an image")
    with pytest.raises(DataError, match="not an image") as info:
        list(loader)
    assert info.value.where == str(paths[3])
    assert any(THREAD_NAME in note and "epoch 0" in note for note in info.value.__notes__)
    loader.close()


def test_closing_or_dropping_a_loader_stops_its_thread(image_dir, tmp_path):
    gc.collect()
    wait_for(lambda: not batch_threads(), "other tests' dropped loaders' threads ended")  # they end on their own
    before = 0
    loader = Loader(image.val(image_dir, size=32), batch_size=4, placement="cpu")
    next(iter(loader))
    assert len(batch_threads()) == before + 1
    loader.close()
    assert len(batch_threads()) == before
    from feedline.datagen.synthetic_criteo import make_criteo

    make_criteo(tmp_path / "c.tsv", 2000, seed=0)
    for spec in (image.train(image_dir, size=32), criteo(tmp_path / "c.tsv")):
        loader = Loader(spec, batch_size=4, placement="cpu")
        it = iter(loader)
        next(it)
        del it, loader  # mid-epoch, never closed
        gc.collect()
        wait_for(lambda: len(batch_threads()) == before, "the dropped loader's thread ended")


class _SlowToFree:
    """Stands for a batch whose tensors take a while to free (torch lets go of the GIL while it frees them)."""

    def __del__(self):
        time.sleep(0.5)


def test_the_exit_hook_joins_a_thread_still_freeing_its_dropped_streams_batches():
    import weakref

    from feedline.loader import background

    go = threading.Event()

    def batches():
        go.wait(30)
        yield from ()

    stream = BackgroundStream(batches, 2)
    stream.held = _SlowToFree()  # freed with the stream, on its thread, after the stream left the open ones
    thread, gone = stream._thread, weakref.ref(stream)
    del stream  # dropped, never closed: its thread ends on its own and frees it as it ends
    go.set()
    wait_for(lambda: gone() is None, "the dropped stream was freed")
    assert thread.is_alive()  # still freeing what the stream held
    background._close_all()  # what runs at exit: it must not return while the thread still runs Python
    assert not thread.is_alive()


def test_the_interpreter_exits_cleanly_with_a_loader_mid_epoch(image_dir):
    script = (f"from feedline.loader import Loader\nfrom feedline.pipelines import image\n"
              f"loader = Loader(image.train({str(image_dir)!r}, size=48), batch_size=4, placement='cpu')\n"
              f"it = iter(loader)\nnext(it)\nprint('took one')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "took one", done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr


def test_a_thread_that_dies_without_a_word_is_reported():
    class Silent:
        def __iter__(self):
            return self

        def __next__(self):
            raise SystemExit  # what no runner should do: ends the thread before it can queue anything

        def close(self):
            pass

    stream = BackgroundStream(lambda: Silent(), depth=2)
    with pytest.raises(SystemExit):
        next(stream)  # handed over like any other error
    stream.close()

    def dies():
        raise KeyboardInterrupt

    stream = BackgroundStream(dies, depth=1)
    with pytest.raises(KeyboardInterrupt):
        next(stream)
    stream.close()


def val32(data):
    return image.val(data, size=32)


@pytest.mark.gpu(pipeline=val32, placements=["gpu"])
def test_batches_on_the_gpu_are_made_on_the_loaders_stream_and_safe_on_the_trainers(image_dir):
    cpu = [b["image"] for b in Loader(val32(image_dir), batch_size=4, placement="cpu", shuffle=False)]
    assert len(cpu) == 10  # 37 images in batches of 4
    loader = Loader(val32(image_dir), batch_size=4, placement="gpu", shuffle=False)
    trainer_stream = torch.cuda.Stream()
    compared = 0
    with torch.cuda.stream(trainer_stream):
        for k, batch in enumerate(loader):
            image_ = batch["image"]
            assert image_.is_cuda and loader.background._cuda_stream != trainer_stream
            assert (image_.float() - cpu[k].cuda().float()).abs().max() <= 1.0 / 255 / 0.224 + 1e-6
            compared += 1
    assert compared == len(cpu)


GPU_SLEEP_CYCLES = 200_000_000  # about 0.1 s of one GPU thread: the other stream's work is still queued after it
ELEMENTS = 1 << 22


@pytest.mark.gpu
def test_the_trainers_stream_waits_for_the_batch_to_be_finished():
    """The batch's last kernel runs on the loader's stream long after the thread handed the batch over; the
    trainer's stream reads it only after that kernel (``wait_event``), never the memory as it was before."""
    def make():
        for k in range(1, 4):
            x = torch.zeros(ELEMENTS, device="cuda")
            torch.cuda._sleep(GPU_SLEEP_CYCLES)  # queued on the loader's stream: the fill below runs after it
            x.fill_(k)
            yield {"x": x}

    stream = BackgroundStream(make, depth=1, cuda=torch.device("cuda"))
    with torch.cuda.stream(torch.cuda.Stream()):
        seen = [int(next(stream)["x"].sum().item()) for _ in range(3)]
    assert seen == [k * ELEMENTS for k in range(1, 4)]
    stream.close()


@pytest.mark.gpu
def test_memory_the_trainer_still_reads_is_not_handed_out_again():
    """The trainer drops a batch while its stream still has a read of it queued; the loader's next batch must
    not get that memory until the read ran (``record_stream``), else it overwrites what the trainer reads."""
    dropped = threading.Event()

    def make():
        x = torch.empty(ELEMENTS, device="cuda")
        x.fill_(1)
        batch = {"x": x}
        del x
        yield batch
        dropped.wait(timeout=60)
        y = torch.empty(ELEMENTS, device="cuda")  # without record_stream: the block the trainer dropped
        y.fill_(2)
        yield {"x": y}

    stream = BackgroundStream(make, depth=1, cuda=torch.device("cuda"))
    with torch.cuda.stream(torch.cuda.Stream()):
        x = next(stream).pop("x")  # the dict is also the thread's: take the only reference to the tensor
        torch.cuda._sleep(GPU_SLEEP_CYCLES)
        copy = x.clone()  # queued on the trainer's stream behind the sleep
        first = x.data_ptr()
        del x
        dropped.set()
        second = next(stream)["x"]
        torch.cuda.synchronize()
    assert int(copy.sum().item()) == ELEMENTS, "the trainer read memory the loader had already reused"
    assert second.data_ptr() != first
    stream.close()
