"""webdataset shards that are crafted or changed behind feedline's back: header fields that would send a tar
reader backwards (negative sizes), bad checksums and pax records, a fuzz of mutated headers; indexes that must not
be trusted (a shard rewritten at the same size and modification time, a sidecar with bad values); the files
feedline writes beside shards never taken for shards."""
from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from feedline.loader import Loader
from feedline.loader.sources import index_store, open_source
from feedline.loader.sources import webdataset as wds_source
from feedline.loader.sources.tar_headers import list_members
from feedline.pipelines import image
from feedline.pipelines.image_sources import WebDataset, image_source
from feedline.pipelines.own_files import sidecar_name

import hostile_tars as ht


pytestmark = pytest.mark.usefixtures("fresh_index_store")


# ---- crafted headers, through the Loader --------------------------------------------------------------------

def _members_with(target_header: bytes | None = None, before: bytes = b"", target_data: bytes | None = None
                  ) -> bytes:
    """Samples k04, k05, k06; k05.jpg's header replaced by ``target_header`` (its data follows unchanged) and
    ``before`` inserted in front of it."""
    out = b"".join(ht.member(n, d) for n, d in ht.sample("k04", 4, 1))
    data = ht.jpeg(5) if target_data is None else target_data
    out += before + (target_header or ht.header(b"k05.jpg", len(data))) + ht.padded(data)
    out += ht.member("k05.cls", b"2")
    out += b"".join(ht.member(n, d) for n, d in ht.sample("k06", 6, 0))
    return out + ht.end()


JPEG5 = ht.jpeg(5)
# case -> (the bad shard's bytes, the words its reason must hold[, the member named where not k05.jpg])
CRAFTED = {
    # Python's tarfile steps back onto the same header and lists it forever (memory grows without bound)
    "negative_size_base256": (_members_with(ht.header(b"k05.jpg", ht.base256(-512))), "negative size"),
    # tarfile seeks before the start of the file: a bare OSError(22) that fails every shard
    "negative_size_octal": (_members_with(ht.header(b"k05.jpg", b"-0004000000\x00")), "not an octal number"),
    "size_not_a_number": (_members_with(ht.header(b"k05.jpg", b"12x4\x00       ")), "not an octal number"),
    "bad_checksum": (_members_with(ht.header(b"k05.jpg", len(JPEG5), checksum=b"0000001\x00")), "checksum"),
    "pax_negative_size": (_members_with(before=ht.pax({"size": "-3000"})), "pax size"),
    "pax_record_too_long": (_members_with(before=ht.pax(b"999 path=k05.jpg\n")), "pax header"),
    "pax_record_without_length": (_members_with(before=ht.pax(b"path=k05.jpg\n")), "pax header"),
    # too large to find the member after them: named by their own header
    "pax_header_too_large": (_members_with(before=ht.header(b"./PaxHeaders/x", 1 << 30, b"x")),
                             "extended header", "./PaxHeaders/x"),
    "gnu_long_name_too_large": (_members_with(before=ht.header(b"././@LongLink", ht.base256(1 << 40), b"L")),
                                "extended header", "././@LongLink"),
}


def _crafted_shards(tmp_path: Path, data: bytes) -> list[str]:
    paths = [str(tmp_path / f"s{k}.tar") for k in range(3)]
    Path(paths[0]).write_bytes(ht.shard_bytes(range(0, 4)))
    Path(paths[1]).write_bytes(data)
    Path(paths[2]).write_bytes(ht.shard_bytes(range(10, 14)))
    return paths


def test_crafted_headers_are_named_skipped_and_never_hang(tmp_path):
    """Every crafted header: on_error="raise" gives a DataError naming ``shard:member``; "skip" delivers every
    other sample and lists that one. Run in a child process under a watchdog (the negative size looped
    forever in tarfile, with memory growing)."""
    spec = {}
    for case, (data, *_) in CRAFTED.items():
        folder = tmp_path / case
        folder.mkdir()
        paths = _crafted_shards(folder, data)
        spec[f"{case}/raise"] = {"kind": "loader", "paths": paths, "on_error": "raise"}
        spec[f"{case}/skip"] = {"kind": "loader", "paths": paths, "on_error": "skip"}
    results = ht.run_child(spec, tmp_path)
    for case, (_, words, *named) in CRAFTED.items():
        bad = str(tmp_path / case / "s1.tar") + ":" + (named[0] if named else "k05.jpg")
        raised = results[f"{case}/raise"]
        assert "data_error" in raised, (case, raised)
        where, reason = raised["data_error"]
        assert where == bad and words in reason, (case, where, reason)
        skipped = results[f"{case}/skip"]
        assert "where" in skipped, (case, skipped)
        k = skipped["where"].index(bad)
        assert [s[0] for s in skipped["skipped"]] == [bad], (case, skipped["skipped"])
        assert sorted(skipped["delivered"]) == [i for i in range(len(skipped["where"])) if i != k], case
        # the samples before the bad header and every sample of the good shards are there, with their labels
        names = [w.rsplit("/", 1)[1] for w in skipped["where"]]
        assert names[:4] == [f"s0.tar:k{k:02d}.jpg" for k in range(4)] and names[-4:] == [
            f"s2.tar:k{k}.jpg" for k in range(10, 14)] and "s1.tar:k04.jpg" in names, (case, names)
        assert skipped["labels"][names.index("s1.tar:k04.jpg")] == 1


def test_the_bad_headers_stop_the_scan_with_a_reason_that_says_so(tmp_path):
    listing = list_members(lambda at, n: CRAFTED["negative_size_base256"][0][at:at + n],
                           len(CRAFTED["negative_size_base256"][0]))
    assert [m[0] for m in listing.members] == ["k04.jpg", "k04.cls"]
    assert listing.end_member == "k05.jpg" and "members from there on cannot be read" in listing.end


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_headers_list_what_tarfile_lists_on_archives_it_writes(fmt):
    """On well-formed archives the header reader agrees with tarfile: long names (GNU long-name members, pax
    paths, ustar prefixes), non-ASCII names, empty members, directories and links between files."""
    buffer = io.BytesIO()
    names = ["a.jpg", "dir/", "dir/" + "long" * 30 + ".jpg", "x" * 90 + "/y" * 20 + ".cls", "ñandú/é.png",
             "empty.cls", "link"]
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tf:
        for k, name in enumerate(names):
            if fmt == tarfile.USTAR_FORMAT and (len(name.rsplit("/", 1)[-1]) > 100 or not name.isascii()):
                continue
            info = tarfile.TarInfo(name)
            data = b"" if name == "empty.cls" else bytes([k]) * (k * 300 + 1)
            if name.endswith("/"):
                info.type = tarfile.DIRTYPE
            elif name == "link":
                info.type, info.linkname = tarfile.SYMTYPE, "a.jpg"
            else:
                info.size = len(data)
            tf.addfile(info, io.BytesIO(data) if info.isreg() else None)
    raw = buffer.getvalue()
    listing = list_members(lambda at, n: raw[at:at + n], len(raw))
    with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
        expected = [(m.name, m.offset_data, m.size) for m in tf.getmembers() if m.isreg()]
    assert listing.end is None and list(listing.members) == expected
    assert len(expected) == (3 if fmt == tarfile.USTAR_FORMAT else 5)


# ---- a fuzz of mutated headers ----------------------------------------------------------------------------

FUZZ_SEED, FUZZ_SHARDS = 20260115, 240


def _base_shard() -> bytes:
    """Samples written every way a header can be: plain ustar, a pax path, a GNU long name, a directory."""
    long_key = "d/" + "n" * 120
    parts = [ht.member(n, d) for n, d in ht.sample("k00", 0, 1)]
    parts.append(ht.pax({"path": "k01.jpg", "mtime": "1700000000.5"}) + ht.member("ignored", ht.jpeg(1)))
    parts.append(ht.member("k01.cls", b"2"))
    parts.append(ht.header(b"d/", 0, b"5"))
    parts.append(ht.header(b"././@LongLink", len(long_key) + 5, b"L") + ht.padded(f"{long_key}.jpg".encode()
                                                                                  + b"\0"))
    parts.append(ht.member("short.jpg", ht.jpeg(2)))
    parts.append(ht.header(b"././@LongLink", len(long_key) + 5, b"L") + ht.padded(f"{long_key}.cls".encode()
                                                                                  + b"\0"))
    parts.append(ht.member("short.cls", b"0"))
    parts += [ht.member(n, d) for n, d in ht.sample("k03", 3, 2)]
    return b"".join(parts) + ht.end()


def _header_offsets(raw: bytes) -> list[int]:
    listing_at, offsets = 0, []
    while listing_at + 512 <= len(raw) and raw[listing_at:listing_at + 512] != bytes(512):
        offsets.append(listing_at)
        size = int(raw[listing_at + 124:listing_at + 136].split(b"\0")[0] or b"0", 8)
        kind = raw[listing_at + 156:listing_at + 157]
        listing_at += 512 + (0 if kind in (b"5", b"2", b"1") else -(-size // 512) * 512)
    return offsets


def mutate(raw: bytes, rng: np.random.Generator) -> tuple[str, bytes]:
    """One mutation of a header field, a pax record or the length of the file; checksums fixed up after a
    field change in most cases, so that the fields behind the checksum are reached."""
    data = bytearray(raw)
    at = int(rng.choice(_header_offsets(raw)))
    kind = ("size_octal", "size_base256", "size_bytes", "checksum", "typeflag", "pax", "truncate", "flip")[
        int(rng.integers(8))]
    if kind == "size_octal":
        value = int(rng.choice([-1, -512, -(1 << 20), 0, 1, 511, 1 << 33, int(rng.integers(0, 1 << 20))]))
        data[at + 124:at + 136] = (b"%011o" % value if value >= 0 else b"-%010o" % -value)[:11] + b"\0"
    elif kind == "size_base256":
        value = int(rng.choice([-512, -1, -(1 << 40), 1 << 70, int(rng.integers(-5000, 5000))]))
        data[at + 124:at + 136] = ht.base256(value)
    elif kind == "size_bytes":
        data[at + 124:at + 136] = rng.bytes(12)
    elif kind == "checksum":
        data[at + 148:at + 156] = rng.bytes(8)
    elif kind == "typeflag":
        data[at + 156] = int(rng.choice(list(b"0123456789xgLKSADMNV\0")))
    elif kind == "pax":
        body = rng.choice([b"-5 path=a\n", b"99999999999999999999 x=y\n", b"5 a\n", b"12 size=-40\n",
                           b"13 size=1e9\n", b"6 =xy\n", b"0 \n", rng.bytes(int(rng.integers(1, 64)))])
        insert = ht.pax(bytes(body))
        data[at:at] = insert
    elif kind == "truncate":
        cut = int(rng.integers(0, len(data)))
        return f"truncate@{cut}", bytes(data[:cut])
    else:
        for pos in rng.integers(at, at + 512, int(rng.integers(1, 6))).tolist():
            data[pos] = int(rng.integers(256))
    if kind not in ("checksum", "pax") and rng.random() < 0.8:
        data[at:at + 512] = ht.fix_checksum(bytes(data[at:at + 512]))
    return f"{kind}@{at}", bytes(data)


@pytest.mark.slow
def test_mutated_headers_always_end_in_samples_or_data_errors(tmp_path):
    """Each mutated shard is indexed and every sample read (header checked) in a child process under a
    watchdog: the scan ends, and each sample comes back or is a DataError; nothing else is raised."""
    base = _base_shard()
    rng = np.random.default_rng(FUZZ_SEED)
    spec, kinds = {}, {}
    for n in range(FUZZ_SHARDS):
        kind, data = mutate(base, rng)
        path = tmp_path / f"f{n:04d}.tar"
        path.write_bytes(data)
        spec[str(n)] = {"kind": "source", "path": str(path)}
        kinds[str(n)] = kind
    results = ht.run_child(spec, tmp_path)
    outcomes = {"samples": 0, "data_errors": 0, "no_samples": 0}
    for n, result in results.items():
        label = f"shard {n} (seed {FUZZ_SEED}, {kinds[n]})"
        assert "other_error" not in result, f"{label}: {result['other_error']}\n{result.get('traceback')}"
        if "no_samples" in result:
            assert "holds a sample" in result["no_samples"], (label, result["no_samples"])
            outcomes["no_samples"] += 1
            continue
        for outcome, where, what in result["samples"]:
            assert outcome != "other_error", f"{label}: {where}: {what}"
            assert where.startswith(str(tmp_path / f"f{int(n):04d}.tar")), (label, where)
            outcomes["samples" if outcome == "ok" else "data_errors"] += 1
    assert all(outcomes.values()), outcomes  # the mutations reach every outcome
    print(f"\nshard fuzz seed {FUZZ_SEED}: {FUZZ_SHARDS} shards, {outcomes}")


# ---- caches that must not be trusted ---------------------------------------------------------------------

def _labels_through_loader(paths) -> list[int]:
    loader = Loader(image.val(paths, size=16, output="uint8"), batch_size=4, placement="cpu", shuffle=False)
    return [label for batch in loader for label in batch["label"].tolist()]


@pytest.mark.parametrize("how", ["rsync -t", "cp -p"])
def test_a_shard_rewritten_at_the_same_size_and_mtime_gives_its_new_labels(tmp_path, how):
    shard = tmp_path / "s0.tar"
    shard.write_bytes(ht.shard_bytes(range(6), first_label=0))
    assert _labels_through_loader([str(shard)]) == [k % 3 for k in range(6)]
    before = os.stat(shard)
    new = ht.shard_bytes(range(6), first_label=1)  # the same members and sizes, other labels
    assert len(new) == before.st_size
    if how == "rsync -t":  # a new file renamed over the old one, its mtime set to the source's
        fresh = tmp_path / ".s0.tar.rsync-tmp"
        fresh.write_bytes(new)
        os.utime(fresh, ns=(before.st_atime_ns, before.st_mtime_ns))
        os.replace(fresh, shard)
    else:  # the same file truncated and written again, its mtime restored
        with open(shard, "r+b") as f:
            f.truncate(0)
            f.write(new)
        os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(shard)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert _labels_through_loader([str(shard)]) == [(k + 1) % 3 for k in range(6)]


def _bad_payloads(good: dict, size: int) -> dict[str, dict]:
    members = good["members"]

    def with_member(k: int, value) -> dict:
        return {**good, "members": [value if j == k else m for j, m in enumerate(members)]}

    name, offset, length = members[2][:3]
    return {
        "negative_size": with_member(2, [name, offset, -5]),
        "offset_past_the_end": with_member(2, [name, size + 512, length]),
        "offset_not_on_a_block": with_member(2, [name, offset + 7, length]),
        "offset_before_the_previous_member": with_member(2, [name, members[0][1], length]),
        "size_as_text": with_member(2, [name, offset, str(length)]),
        "name_not_text": with_member(2, [7, offset, length]),
        "empty_name": with_member(2, ["", offset, length]),
        "label_text_of_another_length": with_member(1, [*members[1][:3], "12345"]),
        "label_text_missing": with_member(1, members[1][:3]),
        "label_text_on_an_image": with_member(0, [*members[0][:3], "1"]),
        "members_not_a_list": {**good, "members": {"a": 1}},
        "end_not_text": {**good, "end": 3},
        "bool_offset": with_member(2, [name, True, length]),
    }


def test_an_index_with_bad_values_is_rebuilt(tmp_path):
    """A sidecar made for this very content (its fingerprint matches) but holding values no scan could
    produce is scanned again, and the samples come from the shard. An index of the earlier format with bad
    values beside it (which that version trusted, failing with a plain ValueError) is not read at all."""
    shard = tmp_path / "s0.tar"
    shard.write_bytes(ht.shard_bytes(range(6)))
    reference = open_source(WebDataset(str(shard)))
    expected = (reference.paths, reference.labels.tolist(), [reference.read(i).tobytes() for i in range(6)])
    fingerprint = index_store.Fingerprint.of(shard)
    good = index_store.load(shard, wds_source.INDEX_KIND, wds_source.INDEX_VERSION, fingerprint)
    assert wds_source.from_payload(good, fingerprint.size) is not None
    stat = os.stat(shard)
    old = {"format": "feedline-webdataset-index", "version": 1, "shard_size": stat.st_size,
           "shard_mtime_ns": stat.st_mtime_ns, "members": [[n, o, -5] + m[3:] for n, o, _, *m in good["members"]],
           "end": None}
    (tmp_path / ".s0.tar.feedline-idx").write_text(json.dumps(old))
    for case, payload in _bad_payloads(good, fingerprint.size).items():
        index_store.save(shard, wds_source.INDEX_KIND, wds_source.INDEX_VERSION, fingerprint, payload)
        assert wds_source.from_payload(payload, fingerprint.size) is None, case
        source = open_source(WebDataset(str(shard)))
        got = (source.paths, source.labels.tolist(), [source.read(i).tobytes() for i in range(6)])
        assert got == expected, case
        assert _labels_through_loader([str(shard)]) == expected[1], case


def test_shard_globs_leave_feedlines_own_files_out(tmp_path):
    """``train-*`` matches the shards, not a sidecar or the index an earlier version left beside them."""
    for k in range(2):
        (tmp_path / f"train-{k}.tar").write_bytes(ht.shard_bytes(range(3 * k, 3 * k + 3)))
    (tmp_path / "train-0.tar.feedline-index.json").write_text("{}")  # an earlier version's index, not hidden
    pattern = str(tmp_path / "train-*")
    assert WebDataset(pattern).paths() == (str(tmp_path / "train-0.tar"), str(tmp_path / "train-1.tar"))
    assert len(open_source(image_source(pattern))) == 6
    with pytest.raises(FileNotFoundError, match="matches no file"):
        WebDataset(str(tmp_path / ".*")).paths()  # only feedline's sidecars are hidden here


def test_nothing_is_written_beside_a_file_that_is_not_a_shard(tmp_path):
    fake = tmp_path / "photo.tar"
    fake.write_bytes(ht.jpeg(1))
    with pytest.raises(ValueError, match="not a tar file"):
        open_source(WebDataset(str(fake)))
    assert sorted(os.listdir(tmp_path)) == ["photo.tar"]


def test_an_unreadable_shard_is_a_bad_sample_not_a_crash(tmp_path, monkeypatch):
    paths = _crafted_shards(tmp_path, ht.shard_bytes(range(4, 7)))
    real = index_store.Fingerprint.of

    def refuse(path):
        if str(path).endswith("s1.tar"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(index_store.Fingerprint, "of", staticmethod(refuse))
    loader = Loader(image.train(paths, size=16, output="uint8"), batch_size=4, placement="cpu", on_error="skip")
    seen = [i for b in loader for i in b["index"][b.get("valid", torch.ones(len(b["index"]), dtype=bool))].tolist()]
    assert len(seen) == 8 and [s.where for s in loader.skipped] == [paths[1]]
    assert "cannot be read: Permission denied" in loader.skipped[0].reason


def test_copied_shards_are_indexed_again(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "s.tar").write_bytes(ht.shard_bytes(range(3)))
    open_source(WebDataset(str(src / "s.tar")))
    dst = tmp_path / "dst"
    shutil.copytree(src, dst)  # the sidecar travels, but the copy is another file: its index is rebuilt
    fingerprint = index_store.Fingerprint.of(dst / "s.tar")
    assert index_store.load(dst / "s.tar", wds_source.INDEX_KIND, wds_source.INDEX_VERSION, fingerprint) is None
    assert open_source(WebDataset(str(dst / "s.tar"))).paths[0] == f"{dst / 's.tar'}:k00.jpg"
    assert sidecar_name("s.tar", wds_source.INDEX_KIND) in os.listdir(dst)
