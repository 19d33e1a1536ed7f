"""``feedline make-data mix`` writes two sources; ``feedline bench --mix`` runs their mix and reports the share each
source delivered, and refuses what does not apply to a mix. Also: a mix refuses remote workers, and a sample
left out with ``on_error="skip"`` leaves its own place invalid, the others in place."""
from __future__ import annotations

import json

import numpy as np
import pytest

from feedline.cli.command import main
from feedline.loader import Loader
from feedline.pipelines import image
from feedline.pipelines.mix import mix

from conftest import write_images


def test_make_data_mix_then_bench_the_mix_with_its_shares(tmp_path, capsys):
    out = tmp_path / "mixed"
    assert main(["make-data", "mix", "--out", str(out), "--count", "12", "--classes", "2", "--seed", "4"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["a", "b"]
    assert len(list((out / "a").rglob("*.jpg"))) + len(list((out / "a").rglob("*.png"))) == 12
    assert main(["make-data", "mix", "--out", str(out), "--count", "12"]) == 2  # not over what is there
    assert "--force" in capsys.readouterr().err
    report = tmp_path / "bench.json"
    assert main(["bench", "--pipeline", "image-train", "--mix", f"a={out / 'a'}:3", f"b={out / 'b'}",
                 "--batch-size", "4", "--batches", "8", "--rounds", "1", "--output", "uint8", "--no-progress",
                 "--json", str(report)]) == 0
    result = json.loads(report.read_text())
    assert result["weights"] == {"a": 0.75, "b": 0.25}
    delivered = result["delivered_samples"]
    total = delivered["a"] + delivered["b"]
    assert total >= 4 * 8 and total % 4 == 0
    # every 24-sample epoch (the sources' sizes added up) of a window of 1000 is a shuffled prefix of a window:
    # the delivered shares are near the weights, not exact; exactness per window is test_mix_order's
    assert abs(result["delivered_share"]["a"] - delivered["a"] / total) < 1e-9
    assert 0.5 < result["delivered_share"]["a"] < 0.95
    assert result["mix_samples_per_s"] > 0 and "single_samples_per_s" not in result


@pytest.mark.parametrize("extra,message", [
    (["--baseline", "torchvision"], "--mix compares the mix"),
    (["--placement", "auto"], "--mix compares the mix"),
])
def test_bench_mix_refuses_what_does_not_apply(tmp_path, extra, message, capsys):
    write_images(tmp_path / "a", 2, classes=1, sizes=[(40, 40)] * 2)
    with pytest.raises(SystemExit):
        main(["bench", "--pipeline", "image-train", "--mix", f"a={tmp_path / 'a'}", f"b={tmp_path / 'a'}", *extra])
    assert message in capsys.readouterr().err


def test_bench_mix_entries_are_checked(tmp_path, capsys):
    write_images(tmp_path / "a", 2, classes=1, sizes=[(40, 40)] * 2)
    with pytest.raises(SystemExit):
        main(["bench", "--pipeline", "image-train", "--mix", f"a={tmp_path / 'a'}"])
    assert "two or more sources" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "--pipeline", "image-train", "--mix", "a", f"b={tmp_path / 'a'}"])
    assert "NAME=PATH" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "--pipeline", "image-train", "--mix", f"a={tmp_path / 'nothing'}:2", f"b={tmp_path / 'a'}"])
    assert "does not exist" in capsys.readouterr().err


def test_a_mix_refuses_remote_workers(tmp_path):
    from feedline.loader.runners.remote import RayWorkers

    write_images(tmp_path / "a", 4, classes=1, sizes=[(40, 40)] * 4)
    spec = mix({"a": image.train(tmp_path / "a", size=32), "b": image.train(tmp_path / "a", size=32)}, {"a": 1, "b": 1})
    with pytest.raises(ValueError, match="remote workers do not run a mix"):
        Loader(spec, batch_size=2, placement="cpu", device="cpu", remote=RayWorkers(2))


def test_a_skipped_sample_leaves_its_own_place_invalid(tmp_path):
    write_images(tmp_path / "a", 6, classes=2, seed=1, sizes=[(48, 48)] * 6)
    for name in ("b", "b_clean"):  # the same five images twice
        write_images(tmp_path / name, 5, classes=1, seed=2, sizes=[(48, 48)] * 5)
    bad = sorted((tmp_path / "b").rglob("*.jpg"))[2]
    bad.write_bytes(b"not a jpeg")
    spec = mix({"a": image.train(tmp_path / "a", size=32, output="uint8"),
                "b": image.train(tmp_path / "b", size=32, output="uint8")}, {"a": 1, "b": 1}, window=4)
    loader = Loader(spec, batch_size=4, placement="cpu", device="cpu", on_error="skip", seed=2)
    batches = [{k: v.numpy() for k, v in b.items()} for b in loader]
    clean = Loader(mix({"a": image.train(tmp_path / "a", size=32, output="uint8"),
                        "b": image.train(tmp_path / "b_clean", size=32, output="uint8")}, {"a": 1, "b": 1}, window=4),
                   batch_size=4, placement="cpu", device="cpu", seed=2)
    reference = [{k: v.numpy() for k, v in b.items()} for b in clean]
    bad_index = 6 + 2  # b's third file, after a's six
    index = np.concatenate([b["index"] for b in batches])
    valid = np.concatenate([b["valid"] for b in batches])
    assert np.array_equal(index, np.concatenate([b["index"] for b in reference]))  # the same places
    assert np.array_equal(valid, index != bad_index) and (index == bad_index).any()
    for got, ref in zip(batches, reference):  # the good samples are where and what they would be anyway
        keep = got["valid"]
        assert np.array_equal(got["image"][keep], ref["image"][keep])
        assert np.array_equal(got["label"][keep], ref["label"][keep])
    assert [s.index for s in loader.skipped] == [2]
    loader.close()
    clean.close()
