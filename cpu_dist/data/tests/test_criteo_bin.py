"""Training batches from a converted directory: equal to the TSV reader's, worker shares,
hashing, day-file splits, epochs and shuffling."""

from pathlib import Path

import numpy as np
import pytest

from cpu_dist.data import CriteoBinary, CriteoTSV, fuse_criteo, make_dataset, train_batches
from cpu_dist.data.convert import convert
from cpu_dist.data.generate import write_days, write_file
from cpu_dist.data.splits import BatchOrder, EveryKth
from cpu_dist.data.tsv_parse import Rows

pytestmark = pytest.mark.timeout(120)

QUIET = {"progress": False, "log": lambda *_: None, "block_bytes": 1 << 15}


def _same(a, b, what=""):
    for f in ("dense", "keys", "labels"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f"{what} {f}")


@pytest.fixture(scope="module")
def one_file(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bin")
    src = write_file(tmp / "train.txt", 4000)
    # Damage a few lines so that skipping shifts rows against lines.
    lines = src.read_bytes().split(b"\n")
    for i in (5, 6, 333, 2999):
        lines[i] = b"x" + lines[i]
    src.write_bytes(b"\n".join(lines))
    convert([str(src)], tmp / "out", skip_bad_lines=True, **QUIET)
    return src, tmp / "out"


def test_worker_shares_and_global_batches_equal_the_tsv_reader(one_file):
    src, out = one_file
    for kw in ({}, {"shuffle": True, "epochs": 2, "seed": 3}, {"max_ind_range": 1000}):
        tsv = make_dataset("criteo", path=src, skip_bad_lines=True, **kw)
        binary = make_dataset("criteo-bin", path=out, **kw)
        assert tsv.bad_lines == binary.bad_lines == 4
        assert tsv.num_steps(96) == binary.num_steps(96) > 0
        for step in (0, 1, 17, tsv.num_steps(96) - 1):
            whole = binary.worker_batch(step, 96, 0, 1)
            _same(tsv.worker_batch(step, 96, 0, 1), whole, f"step {step}")
            parts = [binary.worker_batch(step, 96, r, 3) for r in range(3)]
            for r, part in enumerate(parts):
                _same(part, whole.shard(r, 3), f"step {step} rank {r}")
                _same(tsv.worker_batch(step, 96, r, 3), part, f"tsv step {step} rank {r}")
        assert binary.worker_batch(binary.num_steps(96), 96, 0, 1) is None
        for a, b in zip(tsv.eval_batches(64, 3), binary.eval_batches(64, 3)):
            _same(a, b, "eval")


def test_every_tenth_physical_line_is_eval_after_skipped_lines(one_file):
    _, out = one_file
    ds = CriteoBinary(out, eval_every=10)
    lines = np.asarray(ds._maps[0]["lines"])
    ev = ds.split("eval").positions(0, len(ds.split("eval")))
    tr = ds.split("train").positions(0, len(ds.split("train")))
    assert np.all(lines[ev] % 10 == 9) and np.all(lines[tr] % 10 != 9)
    assert len(ev) + len(tr) == 3996 and 6 not in lines and 333 not in lines
    assert ds.split("test") is None and list(ds.test_batches(10)) == []


def test_keys_follow_the_hashing_flags(one_file):
    _, out = one_file
    sizes = [1000 + f for f in range(26)]
    ds = make_dataset("criteo-bin", path=out, num_embeddings_per_feature=sizes, max_ind_range=1010)
    raw = ds.read_rows(ds.split("train").positions(0, 50)).cats
    got = ds.worker_batch(0, 50, 0, 1).keys
    for f in range(26):
        want = [fuse_criteo(f, int(v), min(sizes[f], 1010)) for v in raw[:, f]]
        assert got[:, f].tolist() == want
    plain = make_dataset("criteo-bin", path=out).worker_batch(0, 50, 0, 1).keys
    np.testing.assert_array_equal(plain & 0xFFFFFFFF, raw)


def test_day_files_train_on_all_but_the_last_which_is_cut_into_eval_and_test(tmp_path):
    days = write_days(tmp_path / "src", 3, 1001, gz=True)
    convert([str(d) for d in days], tmp_path / "out", **QUIET)
    ds = CriteoBinary(tmp_path / "out")
    assert ds.inputs == ["day_0", "day_1", "day_2"]
    assert len(ds.split("train")) == 2002
    assert (len(ds.split("eval")), len(ds.split("test"))) == (500, 501)
    # A batch that spans the two training days is their rows in order.
    tsv0, tsv1 = CriteoTSV(days[0], eval_every=0), CriteoTSV(days[1], eval_every=0)
    span = ds.worker_batch(10, 96, 0, 1)  # rows 960..1055: 41 of day_0, 55 of day_1
    want = Rows.concat([tsv0.read_rows(np.arange(960, 1001)), tsv1.read_rows(np.arange(0, 55))])
    np.testing.assert_array_equal(span.labels, want.labels.astype(np.float32))
    np.testing.assert_array_equal(span.dense, want.dense)
    np.testing.assert_array_equal(span.keys & 0xFFFFFFFF, want.cats)
    last = CriteoTSV(days[2], eval_every=0)
    _same(next(ds.eval_batches(100, 1)), last.worker_batch(0, 100, 0, 1))
    test = list(ds.test_batches(100))
    assert [len(b) for b in test] == [100] * 5 + [1]  # all of it: the partial batch too
    np.testing.assert_array_equal(test[0].keys, last._batch(last.split("train"), 500, 600).keys)


def test_shuffled_epochs_are_permutations_drawn_from_seed_and_epoch():
    order = BatchOrder(1000, 10, epochs=3, shuffle=True, seed=7)
    blocks = [order.block(s) for s in range(order.num_steps)]
    for e in range(3):
        assert sorted(blocks[e * 100 : (e + 1) * 100]) == list(range(100))
    assert blocks[:100] != blocks[100:200] and blocks[:100] != list(range(100))
    again = BatchOrder(1000, 10, epochs=3, shuffle=True, seed=7)
    assert [again.block(s) for s in reversed(range(300))] == blocks[::-1]  # random access
    assert [BatchOrder(1000, 10, 3, True, 8).block(s) for s in range(100)] != blocks[:100]
    assert order.block(300) is None
    assert BatchOrder(1000, 10, None, False, 0).block(12345) == 45
    assert order.positions(5, 1, 2) == (order.block(5) * 10 + 5, order.block(5) * 10 + 10)


def test_every_kth_positions_match_a_plain_filter():
    rng = np.random.default_rng(0)
    lines = np.cumsum(rng.integers(1, 3, 40000))  # increasing with gaps, like skipped lines
    for held_out in (False, True):
        split = EveryKth(lambda lo, hi: lines[lo:hi], len(lines), 7, held_out)
        want = np.flatnonzero((lines % 7 == 6) == held_out)
        assert len(split) == len(want)
        n = len(want)
        for a, b in ((0, 5), (n // 8, n - n // 8), (n - 3, n), (1000, 1000), (8190 % n, n)):
            np.testing.assert_array_equal(split.positions(a, b), want[a:b])
        with pytest.raises(IndexError):
            split.positions(0, len(want) + 1)


def test_the_sample_through_both_paths_and_train_batches_end_with_the_epochs(tmp_path):
    sample = Path(__file__).parent / "data" / "criteo_sample.tsv"
    convert([str(sample)], tmp_path / "o", **QUIET)
    a = make_dataset("criteo", path=sample, epochs=2)
    b = make_dataset("criteo-bin", path=tmp_path / "o", epochs=2)
    steps_a = list(train_batches(a, 50))
    steps_b = list(train_batches(b, 50, start_step=2))
    assert [s for s, _ in steps_a] == [0, 1, 2, 3, 4, 5]  # 180 train lines: 3 per epoch
    assert [s for s, _ in steps_b] == [2, 3, 4, 5]
    for (_, x), (_, y) in zip(steps_a[2:], steps_b):
        _same(x, y)
    _same(steps_a[0][1], steps_a[3][1])  # unshuffled epochs repeat
