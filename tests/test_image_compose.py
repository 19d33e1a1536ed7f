"""Image pipelines composed from typed stages: the standard recipes unchanged, every cut giving the same
batches, custom stages, and the declaration step's errors."""
import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from feedline.loader import Loader
from feedline.loader.sampler import EpochSampler
from feedline.loader.sources import open_source
from feedline.pipelines import geometry, image
from feedline.pipelines.counter_rng import uniform
from runners import image_runner


def _reference_recipe(spec_root, kind, size, output, seed, epoch, indices):
    """The first train/val recipes as they were written before stages were composed (commit 792b240):
    ``train``: 23 uniforms per sample, the first 22 for torchvision's crop window, the last for the flip;
    DALI decodes the window; torch resizes (antialiased bilinear), flips and normalises as
    ``(x - 255 mean) * (1 / (255 std))``. ``val``: DALI decodes all; torch resizes the shorter side, crops the
    centre. Returns the batch as delivered (uint8 NHWC or float32 NCHW)."""
    from nvidia.dali import Pipeline, fn, types

    source = open_source(image.image_source(spec_root))
    data = [np.fromfile(source.paths[i], dtype=np.uint8) for i in indices]
    sizes = np.array([source.size(i, d) for i, d in zip(indices, data)], dtype=np.int64)
    mean = torch.tensor([255.0 * m for m in image.IMAGENET_MEAN]).view(3, 1, 1)
    inv_std = torch.tensor([1.0 / (255.0 * s) for s in image.IMAGENET_STD]).view(3, 1, 1)
    pipe = Pipeline(batch_size=len(indices), num_threads=1, device_id=None)
    if kind == "train":
        u = uniform(seed, epoch, np.asarray(indices), 2 * geometry.ATTEMPTS + 3)
        window = geometry.random_resized_crop(sizes[:, 0], sizes[:, 1], u[:, :-1], (0.08, 1.0), (3 / 4, 4 / 3))
        flips = u[:, -1] < 0.5
        with pipe:
            enc, anchor, shape = fn.external_source(source=lambda: (data, window[:, :2].copy(), window[:, 2:].copy()),
                                                    num_outputs=3, batch=True, dtype=[types.UINT8, types.INT32,
                                                                                      types.INT32], ndim=[1, 1, 1])
            pipe.set_outputs(fn.decoders.image_slice(enc, anchor, shape, output_type=types.RGB, axis_names="WH"))
        targets = [(size, size)] * len(indices)
        crops = [None] * len(indices)
    else:
        flips = np.zeros(len(indices), dtype=bool)
        resize_to = geometry.resize_shorter(sizes[:, 0], sizes[:, 1], round(size * 256 / 224))
        crops = geometry.centre_crop_anchor(resize_to[:, 0], resize_to[:, 1], size)
        targets = [(int(h), int(w)) for w, h in resize_to]
        with pipe:
            pipe.set_outputs(fn.decoders.image(fn.external_source(source=lambda: [data], num_outputs=1, batch=True,
                                                                  dtype=[types.UINT8], ndim=[1])[0],
                                               output_type=types.RGB))
    pipe.build()
    (decoded,) = pipe.run()
    out = []
    for i in range(len(indices)):
        chw = torch.from_numpy(np.asarray(decoded[i])).permute(2, 0, 1)
        chw = F.interpolate(chw.unsqueeze(0), size=targets[i], mode="bilinear", antialias=True, align_corners=False)[0]
        if crops[i] is not None:
            x, y = crops[i]
            chw = chw[:, y:y + size, x:x + size]
        if flips[i]:
            chw = chw.flip(-1)
        if output == "uint8":
            out.append(chw.permute(1, 2, 0).contiguous())
        else:
            out.append((chw.to(torch.float32) - mean) * inv_std)
    return torch.stack(out)


@pytest.mark.parametrize("kind,output", [("train", "float"), ("train", "uint8"), ("val", "float"), ("val", "uint8")])
def test_standard_recipes_equal_the_first_recipes_pixel_for_pixel(image_dir, kind, output):
    size = 96
    spec = getattr(image, kind)(image_dir, size, output=output)
    loader = Loader(spec, batch_size=9, placement="cpu", seed=7, shuffle=True)
    for epoch in range(2):
        for batch in loader:
            expected = _reference_recipe(image_dir, kind, size, output, 7, epoch, batch["index"].tolist())
            assert torch.equal(batch["image"], expected), (epoch, batch["index"].tolist())


def _shift(images):
    """A user's batch function: brighten uint8 images by 10 levels, saturating."""
    return images.clamp(max=245) + 10


def _noisy(images, u):
    """A user's random batch function: add per-sample noise drawn from the sample's own uniforms."""
    return images + (u[:, :1].to(images.dtype)).view(-1, 1, 1, 1)


COMPOSED = [image.decode(roi=True), image.random_resized_crop(48, scale=(0.3, 1.0)), image.horizontal_flip(),
            image.vertical_flip(0.3), image.color_jitter(0.4, 0.4, 0.4, 0.1), image.grayscale(0.2),
            image.rotate(15), image.custom(_shift), image.normalize(), image.custom(_noisy, draws=2)]


def _epoch(spec, cut, batch_size=8, seed=3):
    """The first epoch's batches of ``spec`` at ``cut``, the GPU stages' torch ops run on the CPU."""
    runner = image_runner(spec, cut, batch_size=batch_size, seed=seed, gpu=torch.device("cpu"))
    plans = EpochSampler(len(runner.source), batch_size, seed=seed).epoch(0)
    return [b for b, _ in runner.batches(iter(plans))]


def _cuts_dali_runs_on_the_cpu(spec):
    """Cuts whose DALI part runs on the CPU: every stage after the decoder that is placed on the GPU runs as
    torch ops, which run here with the CPU standing in for the GPU."""
    return [c for c in spec.valid_cuts() if c >= 3]


@pytest.mark.parametrize("recipe", ["train", "val", "composed"])
def test_every_cut_gives_the_batches_of_the_cpu_placement(image_dir, recipe):
    spec = {"train": lambda: image.train(image_dir, 64), "val": lambda: image.val(image_dir, 64),
            "composed": lambda: image.pipeline(image_dir, COMPOSED)}[recipe]()
    reference = _epoch(spec, max(spec.valid_cuts()))
    cuts = _cuts_dali_runs_on_the_cpu(spec)
    assert len(cuts) >= 3
    for cut in cuts[:-1]:
        for a, b in zip(reference, _epoch(spec, cut), strict=True):
            assert torch.equal(a["index"], b["index"])
            assert torch.equal(a["image"], b["image"]), (cut, a["index"].tolist())


def test_a_gpu_only_custom_stage_moves_the_rest_to_the_gpu(image_dir):
    stages = [image.decode(), image.resize((40, 40)), image.custom(_shift, backends="gpu"), image.normalize()]
    spec = image.pipeline(image_dir, stages)
    assert spec.valid_cuts() == [1, 2, 3]
    cpu = _epoch(image.pipeline(image_dir, [*stages[:2], image.custom(_shift), stages[3]]), 5)
    for a, b in zip(cpu, _epoch(spec, 3), strict=True):
        assert torch.equal(a["image"], b["image"])


def test_custom_stages_get_the_batch_and_their_own_randomness(image_dir):
    seen = []

    def record(images, u):
        seen.append((images.shape, images.dtype, u.clone()))
        return images

    spec = image.pipeline(image_dir, [image.decode(), image.center_crop(32), image.custom(record, draws=3)])
    loader = Loader(spec, batch_size=5, placement="cpu", seed=4, shuffle=False)
    batch = next(iter(loader))
    shape, dtype, u = seen[0]
    assert shape == (5, 3, 32, 32) and dtype == torch.uint8
    assert batch["image"].shape == (5, 32, 32, 3)  # uint8 is delivered NHWC
    expected = uniform(4, 0, batch["index"].numpy(), 3)  # decode and center_crop draw nothing
    assert torch.equal(u, torch.from_numpy(expected))


def test_a_custom_stage_that_returns_the_wrong_type_is_named(image_dir):
    spec = image.pipeline(image_dir, [image.decode(), image.center_crop(32),
                                      image.custom(lambda x: x.float(), name="to_float")])
    with pytest.raises(ValueError, match=r"stage 'to_float' returned torch.float32 .*declares torch.uint8"):
        next(iter(Loader(spec, batch_size=4, placement="cpu")))
    spec = image.pipeline(image_dir, [image.decode(), image.center_crop(32),
                                      image.custom(lambda x: x.float() / 255, dtype="float32", name="scale")])
    batch = next(iter(Loader(spec, batch_size=4, placement="cpu")))
    assert batch["image"].dtype == torch.float32 and batch["image"].shape == (4, 3, 32, 32)


def test_augmentation_changes_between_epochs(image_dir):
    spec = image.train(image_dir, 48, output="uint8")
    loader = Loader(spec, batch_size=37, placement="cpu", shuffle=False, seed=1)
    first, second = (next(iter(loader))["image"] for _ in range(2))
    same = [torch.equal(a, b) for a, b in zip(first, second)]
    assert sum(same) <= 2  # a window and a flip drawn again: at most a rare coincidence


@pytest.mark.parametrize("stages,error,match", [
    ([image.resize(32)], ValueError, "decodes first"),
    ([image.decode(), image.decode()], ValueError, "decodes first and only once"),
    ([image.decode(roi=True), image.resize(32)], ValueError, "does not start with a crop"),
    ([image.decode(), image.resize(32)], ValueError, "varying sizes"),
    ([image.decode(), image.custom(_shift), image.center_crop(8)], ValueError, "vary in size"),
    ([image.decode(), image.center_crop(8), image.normalize(), image.normalize()], TypeError, "normalises uint8"),
    ([image.decode(), image.center_crop(8), image.normalize(), image.color_jitter(0.1)], TypeError, "normalize"),
    ([], TypeError, "non-empty list"),
    ([image.decode(), "resize"], TypeError, "image stages"),
])
def test_compositions_are_checked_before_any_data_flows(image_dir, stages, error, match):
    with pytest.raises(error, match=match):
        image.pipeline(image_dir, stages)


@pytest.mark.parametrize("make,match", [
    (lambda: image.random_resized_crop(0), "size"),
    (lambda: image.random_resized_crop(32, scale=(0.5, 0.2)), "scale"),
    (lambda: image.horizontal_flip(1.5), "p must be"),
    (lambda: image.normalize(std=(0.1, 0.0, 0.2)), "std must be positive"),
    (lambda: image.custom(3), "callable"),
    (lambda: image.custom(_shift, backends="tpu"), "backends"),
    (lambda: image.custom(_shift, draws=2), "two arguments"),
    (lambda: image.resize((0, 5)), "size"),
])
def test_stage_arguments_are_checked(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_repeated_stage_names_are_numbered_so_placements_can_name_them(image_dir):
    spec = image.pipeline(image_dir, [image.decode(), image.resize(64), image.center_crop(40), image.resize((32, 32))])
    assert [s.name for s in spec.stages] == ["read", "decode", "resize", "center_crop", "resize_2"]


def test_pipeline_definitions_pickle(image_dir):
    spec = image.pipeline(image_dir, COMPOSED)
    copy = pickle.loads(pickle.dumps(spec))
    assert copy == spec
    assert torch.equal(_epoch(copy, max(copy.valid_cuts()))[0]["image"], _epoch(spec, max(spec.valid_cuts()))[0]["image"])
