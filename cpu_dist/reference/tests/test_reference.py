"""The single-process reference (``cpu_dist.reference``), built from a job's Config as the
launcher parses it: against steps computed by hand (SGD / AdamW dense, SGD / row-wise Adagrad
sparse), float64, a later start step, a learning check, a job file's tables (salted rows, own
widths, optimizers and rates, element-wise Adagrad), and ``python -m cpu_dist.reference``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from cpu_dist.common.config import Config
from cpu_dist.common.contracts import TABLE, row_init
from cpu_dist.common.features import categorical_names
from cpu_dist.common.flags import parse_args
from cpu_dist.common.metrics_log import read_log, read_records
from cpu_dist.common.validate import validate
from cpu_dist.data import Batch, SyntheticCriteo
from cpu_dist.data.batch import Bags
from cpu_dist.models.scoring import evaluate
from cpu_dist.reference import ReferenceTrainer, train_reference
from cpu_dist.reference.__main__ import main
from cpu_dist.train.job_model import build_job_model

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[3]
DIM, ND, NS, B, SEED, SCALE = 3, 2, 26, 4, 4, 0.5
NAMES = list(categorical_names(NS))
# The default job, small: one fused table "embedding" of width DIM, bot [DIM], top [8, 1].
FLAGS = [
    *("--embedding-dim", str(DIM), "--arch-mlp-bot", str(DIM), "--arch-mlp-top", "8-1"),
    *("--batch-size", str(B), "--seed", str(SEED), "--init-scale", str(SCALE)),
]


def config(*flags: str) -> Config:
    """The Config a one-worker job of ``FLAGS`` + ``flags`` runs with."""
    return validate(parse_args(["--worker-num", "1", *FLAGS, *flags]), 2)


def job_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "job.toml"
    path.write_text(text)
    return str(path)


def features_toml(names: list[str]) -> str:
    return json.dumps(names)  # a JSON array of strings is a TOML array


class ListDataset:
    """Fixed global batches as a Dataset (fused keys are whatever the batches hold)."""

    kind, num_dense, num_sparse = "list", ND, NS

    def __init__(self, batches: list[Batch]) -> None:
        self.batches = batches

    def train_batches(self, batch_size, start_step=0):
        for step in range(start_step, len(self.batches)):
            assert len(self.batches[step]) == batch_size
            yield step, self.batches[step]

    def eval_batches(self, batch_size, num_batches):
        return iter(())


def _batches() -> list[Batch]:
    """Three batches whose 26 features draw from 5 keys (one beyond 32 bits): rows shared
    across features and samples, as the fused table shares them."""
    g = np.random.default_rng(0)
    pool = np.array([7, 10, 11, 12, 1 << 33], dtype=np.int64)
    return [
        Batch(
            dense=g.random((B, ND), dtype=np.float32),
            keys=pool[g.integers(0, len(pool), (B, NS))],
            labels=np.array([1, 0, 0, 1], dtype=np.float32),
        )
        for _ in range(3)
    ]


def _hand_train(cfg: Config, batches: list[Batch]):
    """The reference's contract written out: DLRM's formula, explicit dense and row updates
    (float64 dense, float32 rows), from the job model's seeded init and each key's first
    touch row."""
    t_cfg = cfg.train
    lr, sparse_lr = t_cfg.lr, t_cfg.sparse_lr
    init = build_job_model(cfg, ND)
    p = {n: t.detach().double().numpy().copy() for n, t in init.named_parameters()}
    rows: dict[int, np.ndarray] = {}
    accum: dict[int, np.float32] = {}
    adam = {n: (np.zeros_like(v), np.zeros_like(v)) for n, v in p.items()}
    for t, b in enumerate(batches, 1):
        uniq = np.unique(b.keys)
        for k in uniq.tolist():
            if k not in rows:
                rows[k] = row_init(SEED, np.array([k]), DIM, SCALE, TABLE)[0]
                accum[k] = np.float32(0)
        tp = {n: torch.tensor(v, requires_grad=True) for n, v in p.items()}
        trow = torch.tensor(
            np.stack([rows[k] for k in uniq.tolist()]).astype(np.float64), requires_grad=True
        )
        emb = trow[torch.from_numpy(np.searchsorted(uniq, b.keys))]  # [B, F, D]
        x = torch.from_numpy(b.dense).double()
        bottom = torch.relu(x @ tp["bot.0.weight"].T + tp["bot.0.bias"])
        vecs = [bottom] + [emb[:, f] for f in range(NS)]
        dots = [(vecs[i] * vecs[j]).sum(1) for i in range(NS + 1) for j in range(i + 1, NS + 1)]
        z = torch.cat([bottom, torch.stack(dots, 1)], 1)
        h = torch.relu(z @ tp["top.0.weight"].T + tp["top.0.bias"])
        logit = (h @ tp["top.2.weight"].T + tp["top.2.bias"])[:, 0]
        y = torch.from_numpy(b.labels).double()
        loss = -(
            y * torch.log(torch.sigmoid(logit)) + (1 - y) * torch.log(1 - torch.sigmoid(logit))
        ).mean()
        loss.backward()
        for n in p:
            g = tp[n].grad.numpy()
            if t_cfg.dense_optimizer == "sgd":
                p[n] = p[n] - lr * g
            else:  # AdamW, torch's defaults: betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2
                m, v = adam[n]
                m = 0.9 * m + 0.1 * g
                v = 0.999 * v + 0.001 * g * g
                adam[n] = (m, v)
                p[n] = p[n] * (1 - lr * 1e-2) - lr * (m / (1 - 0.9**t)) / (
                    np.sqrt(v / (1 - 0.999**t)) + 1e-8
                )
        for i, k in enumerate(uniq.tolist()):
            g = trow.grad[i].numpy().astype(np.float32)
            if t_cfg.sparse_optimizer == "sgd":
                rows[k] = rows[k] - np.float32(sparse_lr) * g
            else:  # row-wise Adagrad: one accumulator per row, the mean of g^2
                accum[k] = np.float32(accum[k] + np.float32(np.mean(g.astype(np.float64) ** 2)))
                rows[k] = rows[k] - np.float32(sparse_lr / (np.sqrt(accum[k]) + 1e-8)) * g
    keys = np.array(sorted(rows), dtype=np.int64)
    return p, keys, np.stack([rows[k] for k in keys.tolist()])


@pytest.mark.parametrize(
    "dense_opt,sparse_opt,lr,sparse_lr",
    [
        ("sgd", "sgd", "0.5", None),
        ("adamw", "rowwise_adagrad", "0.01", "0.3"),
        ("sgd", "rowwise_adagrad", "0.2", "0.1"),
    ],
)
@pytest.mark.parametrize("steps", [1, 3])
def test_matches_hand_computed_steps(dense_opt, sparse_opt, lr, sparse_lr, steps):
    flags = ["--dense-optimizer", dense_opt, "--sparse-optimizer", sparse_opt, "--lr", lr]
    cfg = config(*flags, *(["--sparse-lr", sparse_lr] if sparse_lr else []))
    assert cfg.train.sparse_lr == float(sparse_lr or lr)  # none given: --lr's
    batches = _batches()
    got = train_reference(cfg, ListDataset(batches), steps)
    p, keys, values = _hand_train(cfg, batches[:steps])
    assert sorted(k for k in got if k.startswith("dense/")) == sorted(f"dense/{n}" for n in p)
    for n, v in p.items():
        assert got[f"dense/{n}"].dtype == np.float32
        np.testing.assert_allclose(got[f"dense/{n}"], v, rtol=2e-5, atol=2e-6, err_msg=n)
    assert {k for k in got if k.startswith("table/")} == {
        "table/embedding/keys",
        "table/embedding/values",
    }
    np.testing.assert_array_equal(got["table/embedding/keys"], keys)
    assert got["table/embedding/values"].dtype == np.float32
    np.testing.assert_allclose(got["table/embedding/values"], values, rtol=2e-5, atol=2e-6)
    # The updates really moved every row (a dead-ReLU init would make this test vacuous).
    moved = got["table/embedding/values"] - row_init(SEED, keys, DIM, SCALE)
    assert np.all(np.abs(moved).max(axis=1) > 1e-4)


def test_float64_dense_keeps_float32_rows():
    batches = _batches()
    flags = ["--lr", "0.5", "--sparse-optimizer", "rowwise_adagrad"]
    d32 = train_reference(config(*flags), ListDataset(batches), 3)
    d64 = train_reference(config(*flags, "--dtype", "float64"), ListDataset(batches), 3)
    assert d64.keys() == d32.keys()
    assert d64["dense/top.2.weight"].dtype == np.float64
    assert d64["table/embedding/values"].dtype == np.float32
    for k in d32:
        np.testing.assert_allclose(d64[k], d32[k], rtol=1e-4, atol=1e-5, err_msg=k)
    assert not np.array_equal(d64["dense/top.2.weight"], d32["dense/top.2.weight"])


def test_start_step_trains_the_later_batches():
    batches = _batches()
    cfg = config("--lr", "0.1")
    got = train_reference(cfg, ListDataset(batches), 1, start_step=2)
    np.testing.assert_array_equal(got["table/embedding/keys"], np.unique(batches[2].keys))
    _, keys, values = _hand_train(cfg, batches[2:3])  # a fresh model's one step on batch 2
    np.testing.assert_array_equal(keys, got["table/embedding/keys"])
    np.testing.assert_allclose(got["table/embedding/values"], values, rtol=2e-5, atol=2e-6)
    trainer = ReferenceTrainer(cfg, ListDataset(batches), start_step=2)
    assert trainer.t == 2
    trainer.step(batches[2])
    assert trainer.t == 3


def test_the_reference_learns_the_synthetic_task():
    """26 features of 5..50 ids each (every id is seen often in 30 steps of 256)."""
    data = SyntheticCriteo(cardinalities=[5, 10, 20, 50] * 6 + [10, 20], seed=1)
    cfg = validate(
        parse_args(
            [
                *("--worker-num", "1", "--embedding-dim", "8", "--arch-mlp-bot", "32-8"),
                *("--arch-mlp-top", "32-1", "--batch-size", "256", "--lr", "0.3"),
                *("--sparse-lr", "0.1", "--sparse-optimizer", "rowwise_adagrad"),
                *("--init-scale", "0.1", "--seed", "0"),
            ]
        ),
        2,
    )
    trainer = ReferenceTrainer(cfg, data)
    ev = data.global_batch(0, 2048, "eval")
    before = evaluate(trainer.predict(ev), ev.labels)
    assert trainer.table_rows()["embedding"][0].size == 0  # predict() creates no rows
    losses = [trainer.step(data.global_batch(s, 256)) for s in range(30)]
    after = evaluate(trainer.predict(ev), ev.labels)
    assert after["auc"] > 0.7 > before["auc"] + 0.1
    assert after["logloss"] < before["logloss"]
    assert np.mean(losses[-10:]) < np.mean(losses[:10])


TWO_TABLES = f"""
[[tables]]
name = "a"
dim = 2
optimizer = "rowwise_adagrad"
lr = 0.1
features = {features_toml(NAMES[:13])}

[[tables]]
name = "b"
dim = 5
init_scale = 0.25
lr = 0.4
features = {features_toml(NAMES[13:])}
"""


def test_tables_have_their_own_salted_rows_widths_and_optimizers(tmp_path):
    cfg = config("--config", job_file(tmp_path, TWO_TABLES), "--sparse-lr", "0.01")
    data = SyntheticCriteo(seed=2)
    batch = data.global_batch(0, B)
    own = batch.keys - data.offsets[None, :]
    a_keys, b_keys = np.unique(own[:, :13]), np.unique(own[:, 13:])
    # first touch: each table's rows are row_init salted by the table's name
    trainer = ReferenceTrainer(cfg, data)
    source = trainer.collections[0].row_source
    fresh_b = source.tables["b"].get(b_keys, create=False)
    np.testing.assert_array_equal(fresh_b, row_init(SEED, b_keys, 5, 0.25, "b"))
    assert not np.array_equal(fresh_b, row_init(SEED, b_keys, 5, 0.25, "a"))
    assert not np.array_equal(fresh_b, row_init(SEED, b_keys, 5, 0.25, TABLE))

    first = train_reference(cfg, data, 1)
    np.testing.assert_array_equal(first["table/a/keys"], a_keys)
    np.testing.assert_array_equal(first["table/b/keys"], b_keys)
    assert first["table/a/values"].shape == (len(a_keys), 2)
    assert first["table/b/values"].shape == (len(b_keys), 5)
    # b: one SGD step at its own lr moved every row away from its salted first touch
    moved_b = first["table/b/values"] - row_init(SEED, b_keys, 5, 0.25, "b")
    assert np.all(np.abs(moved_b).max(axis=1) > 1e-5)
    assert np.all(np.abs(moved_b).max(axis=1) < 0.4)
    # a: row-wise Adagrad's first step is lr * g / sqrt(mean(g^2)): each row moves by RMS lr
    # (its own 0.1, not --sparse-lr's 0.01)
    scale_a = cfg.tables.by_name("a").init_scale
    moved_a = first["table/a/values"] - row_init(SEED, a_keys, 2, scale_a, "a")
    np.testing.assert_allclose(np.sqrt(np.mean(moved_a**2, axis=1)), 0.1, rtol=1e-3)
    # the model projects both widths to the interaction's (bot ends at DIM): proj.<i> for all
    assert {f"dense/proj.{i}.weight" for i in range(NS)} <= set(first)
    assert first["dense/proj.0.weight"].shape == (DIM, 2)
    assert first["dense/proj.13.weight"].shape == (DIM, 5)


ADAGRAD = f"""
[[tables]]
name = "grid"
dim = {DIM}
optimizer = "adagrad"
lr = 0.01
init_scale = 0.5
features = {features_toml(NAMES)}
"""


def test_an_adagrad_tables_first_step_moves_each_element_by_about_lr(tmp_path):
    """Element-wise Adagrad: acc = g*g, so the first step is w -= lr * g / (|g| + eps), about
    lr * sign(g) wherever g is not tiny; its state is [n, dim]."""
    cfg = config("--config", job_file(tmp_path, ADAGRAD))
    data = SyntheticCriteo(seed=2)
    batch = data.global_batch(0, B)
    keys = np.unique(batch.keys - data.offsets[None, :])  # one table: the features share ids
    trainer = ReferenceTrainer(cfg, data)
    trainer.step(batch)
    state = trainer.collections[0].row_source.tables["grid"].state
    assert state.shape == (len(keys), DIM)
    dump = trainer.dump()
    np.testing.assert_array_equal(dump["table/grid/keys"], keys)
    moved = dump["table/grid/values"] - row_init(SEED, keys, DIM, 0.5, "grid")
    big = state > 1e-6  # |g| > 1e-3: the step is lr * |g| / (|g| + 1e-8) ~ lr
    assert big.sum() > len(keys)
    np.testing.assert_allclose(np.abs(moved[big]), 0.01, rtol=1e-4)
    np.testing.assert_array_equal(moved[state == 0], 0)


MULTI_HOT = f"""
[[tables]]
name = "a"
dim = {DIM}
pooling = "mean"
features = {features_toml(NAMES[:13])}

[[tables]]
name = "b"
dim = {DIM}
features = {features_toml(NAMES[13:])}

[data]
bags = {{ cat_2 = [0, 4] }}
"""


@pytest.mark.parametrize("weights", [False, True])
def test_a_multi_hot_job_trains_the_rows_of_its_bags(tmp_path, weights):
    """``[data] bags``: the job's own data (``dataset_for``) gives cat_2 bags of 0..4 ids, and
    the reference trains exactly the rows of table ``a``'s one-hot ids and cat_2's bag ids;
    weighting cat_2 changes the result."""
    text = MULTI_HOT + ('weights = ["cat_2"]\n' if weights else "")
    cfg = config("--config", job_file(tmp_path, text), "--lr", "0.3")
    assert cfg.data.bags == (("cat_2", 0, 4),)
    trainer = ReferenceTrainer(cfg)
    batch = trainer.dataset.global_batch(0, B)
    bag = batch.bags["cat_2"]
    assert (bag.weights is not None) == weights
    own = batch.keys - trainer.dataset.offsets[None, :]
    trainer.step(batch)
    rows = trainer.table_rows()
    a_ids = np.unique(np.concatenate([own[:, [0, 1, *range(3, 13)]].ravel(), bag.values]))
    np.testing.assert_array_equal(rows["a"][0], a_ids)
    np.testing.assert_array_equal(rows["b"][0], np.unique(own[:, 13:]))
    moved = rows["a"][1] - row_init(SEED, a_ids, DIM, cfg.tables.by_name("a").init_scale, "a")
    assert np.all(np.abs(moved).max(axis=1) > 0)
    if weights:  # the same batch unweighted trains other values
        plain = ReferenceTrainer(config("--config", job_file(tmp_path, MULTI_HOT), "--lr", "0.3"))
        unweighted = Batch(
            batch.dense,
            batch.keys,
            batch.labels,
            bags={"cat_2": Bags(lengths=bag.lengths, values=bag.values)},
        )
        plain.step(unweighted)
        assert not np.array_equal(plain.table_rows()["a"][1], rows["a"][1])


CLI = [
    *("--worker-num", "2", "--embedding-dim", "4", "--arch-mlp-bot", "8-4"),
    *("--arch-mlp-top", "8-1", "--batch-size", "16", "--max_step", "3"),
]


def test_python_m_cpu_dist_reference_writes_the_jobs_dump_and_summary(tmp_path):
    dump, metrics = tmp_path / "state.npz", tmp_path / "metrics.jsonl"
    outputs = ["--dump-state", str(dump), "--metrics-out", str(metrics), "--eval-batches", "1"]
    proc = subprocess.run(
        [sys.executable, "-m", "cpu_dist.reference", *CLI, *outputs],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 3 and np.isfinite(summary["loss"])
    assert summary["eval_samples"] == 16 and 0 <= summary["eval_auc"] <= 1  # one batch
    assert read_records(metrics) == [{"summary": summary}]  # after the log's header
    assert read_log(metrics).run
    want = train_reference(validate(parse_args(CLI), 3), steps=3)
    with np.load(dump) as got:
        assert set(got.files) == set(want)
        for k in want:
            assert got[k].dtype == want[k].dtype, k
            np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-7, err_msg=k)


def test_the_cli_exits_2_naming_a_bad_flag(capsys):
    assert main([*CLI, "--lr", "-1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cpu_dist.reference: error:") and "--lr" in err
    with pytest.raises(SystemExit) as exc:  # argparse's own refusal: the usage and exit 2
        main([*CLI, "--dense-optimizer", "lamb"])
    assert exc.value.code == 2
    assert "--dense-optimizer" in capsys.readouterr().err
