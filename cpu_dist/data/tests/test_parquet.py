"""Parquet input (``--data parquet``): columns by feature name, 64-bit ids, bags and weights
read as written across row groups; Criteo's splits and batch order; the same batches as the
Criteo file it was converted from; bad files refused naming the file, the column, the row."""

import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cpu_dist.common.flags import parse_args
from cpu_dist.common.validate import ConfigError, validate
from cpu_dist.data import SyntheticCriteo, WorkerBatches
from cpu_dist.data.factory import dataset_for
from cpu_dist.data.features import BatchFeatures
from cpu_dist.data.loader import warm_first_share
from cpu_dist.data.parquet import ParquetData, ParquetError, read_schema, resolve_columns
from cpu_dist.data.to_parquet import main as to_parquet
from cpu_dist.testing.parquet_files import DATA, TABLES, write_parquet

pytestmark = pytest.mark.timeout(60)

SAMPLE = "cpu_dist/data/tests/data/criteo_sample.tsv"


def _open(path, **kw) -> ParquetData:
    cols = resolve_columns(read_schema(path), dense=["x0", "x1", "x2"], weights={"tags": "tag_w"})
    return ParquetData(path, cols, **kw)


def test_columns_are_read_as_written_across_row_groups(tmp_path):
    path = write_parquet(tmp_path / "d.parquet", rows=230, row_group=17)
    data = _open(path, eval_every=0)
    assert data.columns.features == ("user", "items", "tags") and data.num_dense == 3
    whole = pq.read_table(path)
    batch = data._batch(data.split("train"), 30, 101)  # crosses five row groups
    np.testing.assert_array_equal(batch.bags["user"].values, whole["user"].to_numpy()[30:101])
    items = whole["items"].to_pylist()[30:101]
    np.testing.assert_array_equal(batch.bags["items"].lengths, [len(x) for x in items])
    np.testing.assert_array_equal(batch.bags["items"].values, [v for x in items for v in x])
    weights = [w for x in whole["tag_w"].to_pylist()[30:101] for w in x]
    np.testing.assert_allclose(batch.bags["tags"].weights, weights)
    np.testing.assert_array_equal(batch.labels, whole["label"].to_numpy()[30:101])
    np.testing.assert_array_equal(batch.dense[:, 2], whole["x2"].to_numpy()[30:101].astype("f4"))
    assert batch.bags["user"].values.min() < 0  # negative ids kept as they are


@pytest.mark.parametrize("cache_bytes", [1 << 30, 1])  # all slices kept; one slice kept
def test_slices_of_row_groups_give_the_rows_as_written_in_any_order(tmp_path, cache_bytes):
    # groups of 40 rows in slices of 7 (the last of each group 5): batches that cross slices
    # and groups, in shuffled order; a cache of one slice starts a group again to go back
    path = write_parquet(tmp_path / "d.parquet", rows=230, row_group=40)
    whole = pq.read_table(path)
    items, users = whole["items"].to_pylist(), whole["user"].to_numpy()
    data = _open(path, eval_every=0, shuffle=True, seed=3, slice_rows=7, cache_bytes=cache_bytes)
    rows = data.split("train")
    order = data._order(23)
    seen = []
    for step in range(data.num_steps(23)):
        a, b = order.positions(step)
        want = rows.positions(a, b)
        batch = data._batch(rows, a, b)
        np.testing.assert_array_equal(batch.bags["user"].values, users[want])
        np.testing.assert_array_equal(
            batch.bags["items"].values, [v for r in want for v in items[r]]
        )
        seen += list(want)
    assert sorted(seen) == list(range(230))


def test_the_first_batch_decodes_one_slice_not_its_row_group(tmp_path):
    path = write_parquet(tmp_path / "d.parquet", rows=200, row_group=100)
    data = _open(path, eval_every=0, slice_rows=16)
    _, batch = next(data.train_batches(8))
    assert len(batch.labels) == 8 and list(data._cache) == [(0, 0)]
    data._batch(data.split("train"), 60, 70)  # slices 3 and 4 of the group, after 1 and 2
    assert list(data._cache) == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4)]
    with pytest.raises(ValueError, match="slice_rows must be >= 1"):
        _open(path, slice_rows=0)


def test_splits_and_shares_follow_the_criteo_rules(tmp_path):
    one = _open(write_parquet(tmp_path / "one.parquet", rows=200))
    assert len(one.split("train")) == 180 and len(one.split("eval")) == 20
    assert one.split("test") is None
    np.testing.assert_array_equal(one.split("eval").positions(0, 3), [9, 19, 29])
    _, glob = next(one.train_batches(24, start_step=3))
    parts = [one.worker_batch(3, 24, r, 4) for r in range(4)]
    np.testing.assert_array_equal(
        np.concatenate([p.bags["items"].values for p in parts]), glob.bags["items"].values
    )
    days = tmp_path / "days"
    days.mkdir()
    for i, rows in enumerate((60, 50, 40)):
        write_parquet(days / f"day_{i}.parquet", rows=rows, seed=i, row_group=16)
    many = _open(days)
    assert [f.name for f in many.files] == ["day_0.parquet", "day_1.parquet", "day_2.parquet"]
    assert (len(many.split("train")), len(many.split("eval")), len(many.split("test"))) == (
        110, 20, 20,
    )  # fmt: skip
    test_rows = pq.read_table(days / "day_2.parquet")["label"].to_numpy()[20:]
    got = np.concatenate([b.labels for b in many.test_batches(8)])
    np.testing.assert_array_equal(got, test_rows)
    shuffled = _open(days, shuffle=True, epochs=2, seed=1)
    assert shuffled.num_steps(10) == 22


def test_a_converted_criteo_file_gives_the_same_batches(tmp_path):
    for extra in ([], ["--multi-hot-sizes", "mlperf"]):
        out = tmp_path / f"c{len(extra)}.parquet"
        args = ["--data", "criteo", "--data-path", SAMPLE, *extra]
        assert to_parquet([*args, "--output", str(out), "--row-group-rows", "48"]) == 0
        c1 = validate(parse_args([*args, "--batch-size", "32"]), 3)
        c2 = validate(parse_args(["--data", "parquet", "--data-path", str(out)]), 3)
        assert c2.tables.data_features == c1.tables.data_features
        d1, d2 = dataset_for(c1.data, 0), dataset_for(c2.data, 0)
        f1, f2 = BatchFeatures(c1.tables, d1.kind), BatchFeatures(c2.tables, d2.kind)
        pairs = list(zip(d1.train_batches(32), d2.train_batches(32), strict=True))
        pairs += [
            ((0, a), (0, b))
            for a, b in zip(d1.eval_batches(8, None), d2.eval_batches(8, None), strict=True)
        ]
        assert len(pairs) == 5 + 3
        for (_, a), (_, b) in pairs:
            ka, kb = f1(a), f2(b)
            np.testing.assert_array_equal(ka.values().numpy(), kb.values().numpy())
            np.testing.assert_array_equal(ka.lengths().numpy(), kb.lengths().numpy())
            np.testing.assert_array_equal(a.dense, b.dense)
            np.testing.assert_array_equal(a.labels, b.labels)


def test_a_job_file_names_its_columns(tmp_path):
    path = write_parquet(tmp_path / "d.parquet")
    job = tmp_path / "job.toml"
    job.write_text(TABLES + DATA)
    cfg = validate(parse_args(["--config", str(job), "--data-path", str(path)]), 3)
    assert cfg.data.features == ("user", "items", "tags") == cfg.tables.data_features
    assert cfg.data.weight_columns == (("tags", "tag_w"),) and cfg.data.dense == ("x0", "x1", "x2")
    plain = validate(parse_args(["--data", "parquet", "--data-path", str(path)]), 3)
    assert plain.tables.fused and plain.data.dense == ("x0", "x1", "x2")
    assert plain.data.features == ("user", "items", "tags")  # every integer column, in order
    for text, words in [
        (TABLES.replace('["user"]', '["usr"]'), f"'usr' is not a feature .*parquet {path} has"),
        (
            TABLES.replace('["user"]', '["x0"]') + DATA.replace('dense = ["x0", "x1", "x2"]', ""),
            f"{path}: column 'x0': type float, expected a feature's ids",
        ),
        (TABLES + DATA.replace('"tag_w"', '"x1"'), "column 'x1': type float, expected"),
    ]:
        job.write_text(text if "[data]" in text else text + DATA)
        with pytest.raises(ConfigError, match=words):
            validate(parse_args(["--config", str(job), "--data-path", str(path)]), 3)
    with pytest.raises(ConfigError, match="--max-ind-range: only for Criteo data"):
        validate(parse_args(["--data", "parquet", "--data-path", str(path),
                             "--max-ind-range", "10"]), 3)  # fmt: skip


def _rewrite(path, column, values, type_=None):
    t = pq.read_table(path)
    i = t.schema.get_field_index(column)
    t = t.set_column(i, column, pa.array(values, type=type_ or t.schema.field(i).type))
    pq.write_table(t, path, row_group_size=50)


@pytest.mark.parametrize(
    ("column", "change", "words"),
    [
        ("tag_w", lambda v: [*v[:137], v[137] + [0.5], *v[138:]], "row 137: 3 weights for 2 ids"),
        ("items", lambda v: [*v[:88], None, *v[89:]], "column 'items': row 88: null"),
        ("items", lambda v: [*v[:88], [1, None], *v[89:]], "row 88: a null id in the list"),
        ("label", lambda v: [*v[:61], 2, *v[62:]], "column 'label': row 61: label 2, expected"),
    ],
)
@pytest.mark.parametrize("slice_rows", [8192, 7])
def test_a_bad_row_is_refused_naming_the_file_column_and_row(
    tmp_path, column, change, words, slice_rows
):
    path = write_parquet(tmp_path / "d.parquet", rows=200, row_group=50)
    t = pq.read_table(path)
    values = t[column].to_pylist()
    if column == "tag_w":  # row 137's tags: two ids
        tags = t["tags"].to_pylist()
        tags[137] = tags[137][:2] + [5] * (2 - len(tags[137]))
        _rewrite(path, "tags", tags)
        values = pq.read_table(path)["tag_w"].to_pylist()
        values[137] = values[137][:2] + [0.1] * (2 - len(values[137]))
    _rewrite(path, column, change(values))
    with pytest.raises(ParquetError, match=words) as err:  # weights: found when opened
        data = _open(path, eval_every=0, slice_rows=slice_rows)
        list(data.train_batches(20))
    assert f"{path}: column '{column}'" in str(err.value)


def _two_files(tmp_path):
    """A directory of two files (train, then eval/test) and its job file's arguments."""
    folder = tmp_path / "days"
    folder.mkdir()
    for k in range(2):
        write_parquet(folder / f"day{k}.parquet", rows=200, seed=k)
    job = tmp_path / "job.toml"
    job.write_text(TABLES + DATA)
    return folder, ["--config", str(job), "--data-path", str(folder)]


def test_every_file_s_footer_is_checked_before_training(tmp_path):
    """The flags' checks read every file's footer, not the first one's alone: a later file
    whose id column is float, or whose weights in a row group are fewer than its ids (the
    footer's value counts), is a ConfigError (one line, exit 2) naming the file, the column and
    the row before any rank starts; before, it was a ParquetError on every worker."""
    folder, args = _two_files(tmp_path)
    validate(parse_args(args), 3)
    second = folder / "day1.parquet"
    user = pq.read_table(second)["user"].to_numpy().astype(np.float64)
    _rewrite(second, "user", user, pa.float64())
    with pytest.raises(ConfigError, match=f"{second}: column 'user': type double, expected a"):
        validate(parse_args(args), 3)
    write_parquet(second, rows=200, seed=1)
    tags, w = (pq.read_table(second)[c].to_pylist() for c in ("tags", "tag_w"))
    row = next(r for r in range(150, 200) if len(tags[r]) > 1)  # row group 3 of 50 rows
    w[row] = w[row][:-1]  # one weight short (not a list of one made empty: counts would agree)
    _rewrite(second, "tag_w", w)
    ids = len(tags[row])
    words = (
        f"{second}: column 'tag_w': row {row}: {ids - 1} weights for {ids} ids of feature 'tags'"
    )
    with pytest.raises(ConfigError, match=words):
        validate(parse_args(args), 3)
    with pytest.raises(ParquetError, match=words):  # and any reader of the files, when opened
        _open(folder)


def test_a_corrupt_page_is_refused_naming_its_column(tmp_path):
    path = write_parquet(tmp_path / "d.parquet", rows=200, row_group=100)
    chunk = pq.ParquetFile(path).metadata.row_group(1).column(5)  # 'items' (its ids)
    assert chunk.path_in_schema.startswith("items.")
    raw = bytearray(path.read_bytes())
    end = (chunk.dictionary_page_offset or chunk.data_page_offset) + chunk.total_compressed_size
    middle = (chunk.data_page_offset + end) // 2  # inside its (snappy) data page
    raw[middle : middle + 16] = b"\xff" * 16
    path.write_bytes(bytes(raw))
    data = _open(path, eval_every=0)
    with pytest.raises(ParquetError, match=rf"{path}: column 'items': row group 1 \(rows 100"):
        list(data.train_batches(20))


def test_a_file_that_is_not_parquet_is_refused(tmp_path):
    bad = tmp_path / "x.parquet"
    bad.write_text("label,x0\n1,2\n")
    with pytest.raises(ConfigError, match=f"{bad}: not a readable Parquet file"):
        validate(parse_args(["--data", "parquet", "--data-path", str(bad)]), 3)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="no Parquet files"):
        validate(parse_args(["--data", "parquet", "--data-path", str(empty)]), 3)


def test_the_first_share_is_decoded_ahead_and_its_error_left_to_the_loader(tmp_path, monkeypatch):
    path = write_parquet(tmp_path / "d.parquet", rows=200, row_group=100)
    data = _open(path, eval_every=0, slice_rows=16)
    thread = warm_first_share(data, 2, 24, 1, 2)  # rank 1's rows [60, 72) of step 2
    assert thread is not None
    thread.join(30)
    # its group's slices in order, up to those of rows 48..80, and no further
    assert list(data._cache) == [(0, k) for k in range(5)]
    np.testing.assert_array_equal(
        next(WorkerBatches(data, 24, 2, 1, 2, stop_step=3))[1].labels,
        pq.read_table(path)["label"].to_numpy()[60:72],
    )
    assert warm_first_share(SyntheticCriteo(), 0, 8, 0, 1) is None  # nothing it would keep
    unhandled: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda a: unhandled.append(a.exc_value))
    _rewrite(path, "label", [*[0] * 5, 2, *[1] * 194])
    bad = _open(path, eval_every=0)
    thread = warm_first_share(bad, 0, 20, 0, 1)
    assert thread is not None
    thread.join(30)
    assert not unhandled  # the warm read's error is not raised on its thread
    with pytest.raises(ParquetError, match="row 5: label 2"):
        next(WorkerBatches(bad, 20, 0, 0, 1))
