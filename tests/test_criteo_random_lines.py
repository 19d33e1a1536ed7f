"""Property: random malformed lines among good Criteo rows never crash the reader with anything but the
documented RowError (naming the file and a line where a malformed line stands), and with on_error="skip"
every good row still arrives, exactly once, through the Loader."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feedline.loader import Loader
from feedline.loader.sources.table_rows import RowError
from feedline.pipelines.criteo import criteo


def good_line(i: int) -> str:
    fields = [str(i % 2), str(1000 + i)] + [str(j) for j in range(12)] + [f"{i * 31 + j:x}" for j in range(26)]
    return "\t".join(fields)


field_text = st.text(alphabet="0123456789abcdefXYZ-+. \\x00é", max_size=12)
malformed = st.one_of(
    st.lists(field_text, min_size=0, max_size=45).map("\t".join),                    # any fields, any count
    st.tuples(st.integers(0, 39), field_text).map(                # one field of another row replaced
        lambda t: "\t".join(f if k != t[0] else t[1] for k, f in enumerate(good_line(99).split("\t")))),
    st.text(max_size=80).map(lambda s: s.replace("\n", " ").replace("\r", " ")),     # free text
)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(inserts=st.lists(st.tuples(st.integers(0, 12), malformed), min_size=1, max_size=4))
def test_malformed_lines_raise_the_documented_error_or_are_skipped(tmp_path_factory, inserts):
    lines = [good_line(i) for i in range(12)]
    malformed_at = set()
    for position, text in sorted(inserts, key=lambda t: -t[0]):
        lines.insert(position, text)
    good_rows = {i for i in range(12)}
    numbers = {}
    for number, text in enumerate(lines, start=1):
        numbers.setdefault(text, []).append(number)
    for _, text in inserts:
        malformed_at.update(numbers[text])
    path = tmp_path_factory.mktemp("criteo") / "day.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    try:
        list(Loader(criteo(path), batch_size=5, placement="cpu"))
    except RowError as err:
        assert err.file == str(path) and err.line in malformed_at

    loader = Loader(criteo(path, on_error="skip"), batch_size=5, shuffle=True, seed=1, placement="cpu")
    dense = np.concatenate([b["dense"][:, 0][b["valid"]].numpy() if "valid" in b else b["dense"][:, 0].numpy()
                            for b in loader])
    first_dense = np.rint(np.expm1(dense.astype(np.float64))).astype(np.int64) - 1000
    arrived = sorted(v for v in first_dense.tolist() if 0 <= v < 12)
    assert arrived == sorted(good_rows)  # every good row once; accepted odd lines may add others
    assert len(dense) + len(loader.skipped) == len(lines)
