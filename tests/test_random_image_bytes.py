"""Property: whatever bytes a file holds, the Loader either delivers it or names it in a DataError (raise),
or leaves it out and still delivers every good sample (skip). Nothing else escapes."""
import io
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from feedline.loader import DataError, Loader
from feedline.loader.sources import open_source
from feedline.pipelines import image

from conftest import _photo_like


def _jpeg() -> bytes:
    out = io.BytesIO()
    Image.fromarray(_photo_like(np.random.default_rng(0), 96, 80)).save(out, format="JPEG", quality=90)
    return out.getvalue()


JPEG = _jpeg()

random_bytes = st.binary(min_size=0, max_size=2048)
damaged_jpeg = st.tuples(st.integers(0, len(JPEG) - 1), st.integers(1, 64), st.binary(min_size=1, max_size=64)).map(
    lambda t: JPEG[:t[0]] + t[2] + JPEG[t[0] + t[1]:])
cut_jpeg = st.integers(0, len(JPEG)).map(lambda n: JPEG[:n])


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=st.one_of(random_bytes, damaged_jpeg, cut_jpeg))
def test_any_bytes_arrive_or_are_named(tmp_path_factory, payload):
    root = tmp_path_factory.mktemp("fuzz")
    folder = root / "c"
    folder.mkdir()
    for k in range(3):
        (folder / f"good_{k}.jpg").write_bytes(JPEG)
    odd = folder / "odd.jpg"
    odd.write_bytes(payload)
    spec = image.train(root, size=24, output="uint8")
    odd_index = open_source(spec.source).paths.index(str(odd))
    try:
        delivered = [i for b in Loader(spec, batch_size=2, shuffle=False, placement="cpu") for i in b["index"].tolist()]
        assert sorted(delivered) == [0, 1, 2, 3]
    except DataError as err:
        assert err.where == str(odd)
    loader = Loader(spec, batch_size=2, shuffle=False, placement="cpu", on_error="skip")
    delivered = [i for b in loader for i in b["index"][b.get("valid", b["index"] >= 0)].tolist()]
    good = [i for i in range(4) if i != odd_index]
    assert sorted(delivered) in (good, [0, 1, 2, 3])
    assert (odd_index in delivered) != bool(loader.skipped)
    shutil.rmtree(root)
