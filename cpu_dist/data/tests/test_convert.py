"""The converter: the layout, manifest checksums, .gz, bad and wide lines, resuming."""

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from cpu_dist.data import CriteoFormatError, CriteoTSV
from cpu_dist.data import convert as convert_module
from cpu_dist.data.convert import convert, main, order_inputs
from cpu_dist.data.generate import write_days, write_file
from cpu_dist.data.layout import ARRAYS, MANIFEST, PART, LayoutError, read_manifest, verify

pytestmark = pytest.mark.timeout(120)

SAMPLE = Path(__file__).parent / "data" / "criteo_sample.tsv"


def _quiet(**kw):
    return {"progress": False, "log": lambda *_: None, "block_bytes": 1 << 16, **kw}


def _arrays(folder: Path, rows: int) -> dict[str, np.ndarray]:
    return {
        a.name: np.fromfile(folder / a.file, dtype=a.dtype).reshape(a.shape(rows)) for a in ARRAYS
    }


def test_layout_holds_the_parsed_rows_and_checksums(tmp_path):
    src = write_file(tmp_path / "train.txt", 3000)
    m = convert([str(src)], tmp_path / "out", **_quiet(threads=2))
    assert m["rows"] == m["lines"] == 3000 and m["bad_lines"] == 0
    assert m["hashing"]["applied"] is False and m["hashing"]["default_hash_size"] == 2**32
    part = m["inputs"][0]
    assert part["name"] == "train.txt" and part["source_bytes"] == src.stat().st_size
    got = _arrays(tmp_path / "out" / "train.txt", 3000)
    want = CriteoTSV(src, eval_every=0).read_rows(np.arange(3000))
    for name in ("labels", "dense", "cats", "lines"):
        np.testing.assert_array_equal(got[name], getattr(want, name), err_msg=name)
    assert verify(tmp_path / "out") == []
    # A flipped byte is caught by its checksum, a cut file by its size.
    cats = tmp_path / "out" / "train.txt" / "cats.u32"
    raw = bytearray(cats.read_bytes())
    raw[100] ^= 1
    cats.write_bytes(bytes(raw))
    assert "cats.u32: crc32" in verify(tmp_path / "out")[0]
    (tmp_path / "out" / "train.txt" / "lines.i64").write_bytes(b"")
    assert any("lines.i64: 0 bytes" in p for p in verify(tmp_path / "out"))


def test_gzip_input_gives_the_same_arrays(tmp_path):
    plain = write_file(tmp_path / "day_0", 2000)
    gz = tmp_path / "gz" / "day_0.gz"
    gz.parent.mkdir()
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    convert([str(plain)], tmp_path / "a", **_quiet())
    convert([str(gz)], tmp_path / "b", **_quiet())
    for a in ARRAYS:
        assert (tmp_path / "a/day_0" / a.file).read_bytes() == (
            tmp_path / "b/day_0" / a.file
        ).read_bytes()


def _damaged(tmp_path: Path, bad: dict[int, tuple[int, bytes]], name: str = "bad.tsv") -> Path:
    lines = SAMPLE.read_bytes().split(b"\n")[:-1]
    for i, (col, value) in bad.items():
        f = lines[i].split(b"\t")
        f[col] = value
        lines[i] = b"\t".join(f)
    p = tmp_path / name
    p.write_bytes(b"\n".join(lines) + b"\n")
    return p


def test_bad_and_wide_lines_stop_or_are_skipped_and_counted(tmp_path):
    src = _damaged(tmp_path, {41: (3, b"1.5"), 150: (20, b"123456789")})
    with pytest.raises(CriteoFormatError, match=r"bad.tsv:42: integer field I3"):
        convert([str(src)], tmp_path / "o1", **_quiet())
    assert not (tmp_path / "o1" / MANIFEST).exists()
    src2 = _damaged(tmp_path, {150: (20, b"123456789")}, "wide.tsv")
    with pytest.raises(CriteoFormatError, match=r"wide.tsv:151: .*C7.* wider than 32 bits"):
        convert([str(src2)], tmp_path / "o2", **_quiet())
    m = convert([str(src)], tmp_path / "o3", **_quiet(skip_bad_lines=True))
    assert (m["lines"], m["rows"], m["bad_lines"]) == (200, 198, 2)
    lines = _arrays(tmp_path / "o3" / "bad.tsv", 198)["lines"]
    assert 41 not in lines and 150 not in lines and lines[-1] == 199
    assert main([str(src), "--output", str(tmp_path / "o4"), "--no-progress"]) == 1


def test_resume_skips_finished_inputs_and_redoes_a_partial_one(tmp_path, monkeypatch):
    days = write_days(tmp_path / "src", 3, 1500)
    fresh = convert([str(d) for d in days], tmp_path / "fresh", **_quiet())
    out = tmp_path / "out"
    real_parse = convert_module.parse_block
    calls = {"n": 0}

    def failing(data, first, path, *rest):  # dies in the middle of day_1
        if path.endswith("day_1"):
            calls["n"] += 1
            if calls["n"] == 3:
                raise KeyboardInterrupt
        return real_parse(data, first, path, *rest)

    monkeypatch.setattr(convert_module, "parse_block", failing)
    with pytest.raises(KeyboardInterrupt):
        convert([str(d) for d in days], out, **_quiet(threads=1))
    assert (out / "day_0" / PART).exists() and not (out / "day_1" / PART).exists()
    assert not (out / MANIFEST).exists()
    with pytest.raises(LayoutError, match="missing"):
        read_manifest(out)
    monkeypatch.setattr(convert_module, "parse_block", real_parse)
    said: list[str] = []
    m = convert([str(d) for d in reversed(days)], out, **_quiet(log=said.append))
    assert "already converted" in said[0] and "day_0" in said[0]
    assert "day_1" in said[1] and "already" not in said[1]
    assert [p["name"] for p in m["inputs"]] == ["day_0", "day_1", "day_2"]
    assert [p["files"] for p in m["inputs"]] == [p["files"] for p in fresh["inputs"]]
    assert verify(out) == []
    # A changed source is converted again.
    days[2].write_bytes(days[2].read_bytes()[: -days[2].stat().st_size // 2].rsplit(b"\n", 1)[0])
    said.clear()
    m = convert([str(d) for d in days], out, **_quiet(log=said.append))
    assert "already" not in said[2] and m["inputs"][2]["rows"] < 1500


def test_input_order_and_names(tmp_path):
    assert order_inputs(["a/day_10.gz", "b/day_2", "day_0.gz"]) == [
        "day_0.gz",
        "b/day_2",
        "a/day_10.gz",
    ]
    assert order_inputs(["z.tsv", "a.tsv"]) == ["z.tsv", "a.tsv"]
    with pytest.raises(ValueError, match="share an output folder"):
        order_inputs(["a/day_1", "b/day_1.gz"])
    with pytest.raises(FileNotFoundError):
        convert([str(tmp_path / "nope")], tmp_path / "o", **_quiet())


def test_reader_refuses_other_versions_and_cut_files(tmp_path):
    from cpu_dist.data import CriteoBinary

    shutil.copy(SAMPLE, tmp_path / "s.tsv")
    convert([str(tmp_path / "s.tsv")], tmp_path / "o", **_quiet())
    CriteoBinary(tmp_path / "o")
    (tmp_path / "o/s.tsv/dense.f32").write_bytes(b"\0" * 16)
    with pytest.raises(
        LayoutError, match=r"dense.f32: 16 bytes, the manifest's 200 rows need 10400"
    ):
        CriteoBinary(tmp_path / "o")
    m = json.loads((tmp_path / "o" / MANIFEST).read_text())
    m["version"] = 99
    (tmp_path / "o" / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(LayoutError, match="version 99"):
        CriteoBinary(tmp_path / "o")
