"""Batches are made on the loader's own thread: the trainer's thread only takes finished ones, what was made
but not taken is never counted as delivered, errors cross with their context, and no thread outlives the
Loader. Proved structurally (which thread did the work, what was ready when), never by wall-clock bounds."""
import gc
import subprocess
import sys
import threading
import time

import pytest
import torch

from feedline.loader import DataError, Loader
from feedline.loader.background import THREAD_NAME, BackgroundStream
from feedline.loader.runners.images import ImageRunner
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


@pytest.fixture
def spy(monkeypatch):
    """Records, for every batch an ImageRunner finishes, the thread that made it and when."""
    made = []
    real = ImageRunner._batch

    def recording(self, images, host):
        batch = real(self, images, host)
        made.append((threading.current_thread().name, time.monotonic(), batch["index"].tolist()))
        return batch

    monkeypatch.setattr(ImageRunner, "_batch", recording)
    return made


def test_the_trainer_thread_only_takes_finished_batches(image_dir, spy):
    loader = Loader(image.train(image_dir, size=64), batch_size=4, placement="cpu", seed=1, prefetch=2)
    it = iter(loader)
    first = next(it)
    assert all(thread == THREAD_NAME for thread, _, _ in spy)
    # The trainer "works" (here: blocks) and the next batches are finished meanwhile, on the loader's thread.
    wait_for(lambda: loader._stream.ready == 2, "two batches are ready")
    asked = time.monotonic()
    cpu = time.thread_time()
    second = next(it)
    cpu = time.thread_time() - cpu
    made = {tuple(index): when for _, when, index in spy}
    assert made[tuple(second["index"].tolist())] < asked
    assert first["image"].shape == (4, 3, 64, 64)
    # Taking a finished batch costs the trainer's thread no decoding or resizing: far below one image's work.
    assert cpu < 0.002
    loader.close()


def test_iterating_thread_cpu_per_batch_is_small(image_dir):
    """Over a whole epoch, the trainer's thread spends a fraction of a millisecond of CPU per batch; the
    batch thread does the decoding, resizing and normalising (milliseconds per batch)."""
    loader = Loader(image.train(image_dir, size=96), batch_size=4, placement="cpu", seed=2)
    it = iter(loader)
    next(it)  # the first batch waits for the pipeline to start
    spent, batches = 0.0, 0
    while True:
        started = time.thread_time()
        try:
            next(it)
        except StopIteration:
            break
        spent += time.thread_time() - started
        batches += 1
    assert batches == 9  # 37 images in batches of 4, after the first
    assert spent / batches < 0.001
    loader.close()


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
    from feedline.benchmarks.data.criteo import make_criteo

    make_criteo(tmp_path / "c.tsv", 2000, seed=0)
    for spec in (image.train(image_dir, size=32), criteo(tmp_path / "c.tsv")):
        loader = Loader(spec, batch_size=4, placement="cpu")
        it = iter(loader)
        next(it)
        del it, loader  # mid-epoch, never closed
        gc.collect()
        wait_for(lambda: len(batch_threads()) == before, "the dropped loader's thread ended")


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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_batches_on_the_gpu_are_made_on_the_loaders_stream_and_safe_on_the_trainers(image_dir):
    cpu = [b["image"] for b in Loader(image.val(image_dir, size=32), batch_size=4, placement="cpu", shuffle=False)]
    loader = Loader(image.val(image_dir, size=32), batch_size=4, placement="gpu", shuffle=False)
    trainer_stream = torch.cuda.Stream()
    with torch.cuda.stream(trainer_stream):
        for k, batch in enumerate(loader):
            image_ = batch["image"]
            assert image_.is_cuda and loader._stream._cuda_stream != trainer_stream
            assert (image_.float() - cpu[k].cuda().float()).abs().max() <= 1.0 / 255 / 0.224 + 1e-6
