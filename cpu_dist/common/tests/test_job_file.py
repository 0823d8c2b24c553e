"""The job's tables (cpu_dist/common/tables.py) and the job file (``--config``,
cpu_dist/common/job_file.py): precedence, the ``[[tables]]`` keys and every refusal."""

from __future__ import annotations

import pytest

from cpu_dist.common.contracts import default_init_scale, table_salt
from cpu_dist.common.features import CATEGORICAL_FEATURES, DENSE_FEATURES
from cpu_dist.common.flags import parse_args
from cpu_dist.common.tables import JobTables, TableConfig
from cpu_dist.common.validate import validate

pytestmark = pytest.mark.timeout(30)


def test_every_job_without_a_file_has_the_one_fused_table_of_its_flags():
    args = parse_args(
        [
            "--embedding-dim",
            "16",
            "--sparse-optimizer",
            "rowwise_adagrad",
            "--sparse-lr",
            "0.25",
            "--ps-admit-after",
            "3",
            "--ps-expire-after",
            "7",
            "--seed",
            "5",
        ]
    )
    cfg = validate(args, 3)
    assert cfg.tables.fused and cfg.tables.names == ("embedding",)
    (t,) = cfg.tables.tables
    assert (t.dim, t.optimizer, t.lr, t.admit_after, t.expire_after) == (
        16,
        "rowwise_adagrad",
        0.25,
        3,
        7,
    )
    assert t.init_scale == default_init_scale(16) == cfg.model.init_scale
    assert t.features == CATEGORICAL_FEATURES and cfg.tables.table_of("cat_25") is t
    assert cfg.tables.columns("embedding") == tuple(range(26))
    assert cfg.tables.specs(cfg.train.seed) == [
        {
            "name": "embedding",
            "dim": 16,
            "optimizer": "rowwise_adagrad",
            "init_scale": default_init_scale(16),
            "seed": 5,
            "num_embeddings": 0,
            "admit_after": 3,
            "expire_after": 7,
            "eps": 0.0,
        }
    ]
    assert table_salt(t.name) == 0  # today's row_init and partition hash


def test_features_are_named_as_torchrec_names_criteo_s():
    assert CATEGORICAL_FEATURES == tuple(f"cat_{i}" for i in range(26))
    assert DENSE_FEATURES == tuple(f"int_{i}" for i in range(13))


def test_a_table_spec_sends_admission_one_as_off_and_eps_only_for_adagrad():
    sgd = TableConfig("a", 4, ("cat_0",), admit_after=1, eps=1e-3)
    ada = TableConfig("b", 4, ("cat_1",), optimizer="adagrad", eps=1e-3)
    assert sgd.spec(0)["admit_after"] == 0 and sgd.spec(0)["eps"] == 0.0
    assert ada.spec(0)["eps"] == 1e-3 and ada.init_scale == default_init_scale(4)


def test_job_tables_refuse_a_shared_feature_and_a_duplicate_name():
    a = TableConfig("a", 4, ("cat_0",))
    with pytest.raises(ValueError, match="'cat_0' is in table 'a' and in 'b'"):
        JobTables((a, TableConfig("b", 4, ("cat_0",))))
    with pytest.raises(ValueError, match="two tables are named 'a'"):
        JobTables((a, TableConfig("a", 4, ("cat_1",))))
    with pytest.raises(KeyError, match="no table named 'c'"):
        JobTables((a,)).by_name("c")


# --- the job file -------------------------------------------------------------------------

ALL = [f"cat_{i}" for i in range(26)]


def toml_tables(*tables: dict) -> str:
    """[[tables]] entries as TOML text (values through repr: str, int, float, list)."""

    def value(v):
        if isinstance(v, bool):
            return str(v).lower()
        if isinstance(v, str):
            return '"' + v + '"'
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return repr(v)

    out = []
    for t in tables:
        out.append("[[tables]]")
        out += [f"{k} = {value(v)}" for k, v in t.items()]
        out.append("")
    return "\n".join(out)


CRITEO = '[data]\nkind = "criteo"\n'


def two_tables(**first) -> str:
    return toml_tables(
        {"name": "a", "features": ALL[:2], **first}, {"name": "b", "features": ALL[2:]}
    )


@pytest.fixture
def job(tmp_path):
    """Write a job file and return the validated Config of ``--config FILE *argv``."""

    def make(text: str, *argv: str, world: int = 3):
        path = tmp_path / "job.toml"
        path.write_text(text)
        return validate(parse_args(["--config", str(path), *argv]), world)

    return make


@pytest.fixture
def refused(job, tmp_path, capsys):
    """The one error message a job file gets (from validate, or from the parse)."""

    def check(text: str, *argv: str) -> str:
        from cpu_dist.common.validate import ConfigError

        try:
            job(text, *argv)
        except ConfigError as exc:
            message = str(exc)
        except SystemExit as exc:
            assert exc.code == 2
            message = capsys.readouterr().err.strip()
        else:
            raise AssertionError("the job file was accepted")
        assert str(tmp_path / "job.toml") in message or "--config" in message
        return message

    return check


def test_a_job_file_declares_tables_whose_omitted_keys_come_from_the_flags(job):
    cfg = job(
        two_tables(dim=8, optimizer="adagrad", lr=0.05, init_scale=0.3, eps=1e-6, admit_after=2)
        + "\n",
        "--embedding-dim",
        "8",
        "--sparse-optimizer",
        "rowwise_adagrad",
        "--sparse-lr",
        "0.2",
        "--ps-expire-after",
        "9",
    )
    a, b = cfg.tables.tables
    assert not cfg.tables.fused and cfg.tables.names == ("a", "b")
    assert (a.dim, a.optimizer, a.lr, a.init_scale, a.eps, a.admit_after, a.expire_after) == (
        8,
        "adagrad",
        0.05,
        0.3,
        1e-6,
        2,
        9,
    )
    # b omits every key: the flags' values, init scale from its own width
    assert (b.dim, b.optimizer, b.lr, b.init_scale, b.admit_after, b.expire_after) == (
        8,
        "rowwise_adagrad",
        0.2,
        default_init_scale(8),
        0,
        9,
    )
    assert cfg.tables.table_of("cat_1") is a and cfg.tables.columns("b") == tuple(range(2, 26))
    assert cfg.model.embedding_dim == 8 and cfg.model.bot_mlp[-1] == 8


def test_a_table_s_own_keys_are_never_overridden_by_a_flag(job):
    cfg = job(
        two_tables(dim=16, lr=0.05, init_scale=0.3),
        "--embedding-dim",
        "16",
        "--init-scale",
        "0.9",
        "--sparse-lr",
        "0.7",
    )
    a, b = cfg.tables.tables
    assert (a.lr, a.init_scale) == (0.05, 0.3) and (b.lr, b.init_scale) == (0.7, 0.9)


def test_precedence_command_line_over_file_over_default(job):
    text = (
        '[job]\nbatch_size = 512\nmax_step = 7\nsparse_sync = "barrier"\nshuffle = false\n\n'
        + two_tables()
    )
    cfg = job(text, "--max_step", "9")
    assert cfg.train.batch_size == 512  # the file's, over the default 2048
    assert cfg.train.max_step == 9 and cfg.train.max_step_given  # the command line's
    assert cfg.train.sparse_sync == "barrier"
    assert cfg.train.lr == 0.5  # neither: the default


def test_job_values_may_be_arrays_where_the_flag_takes_a_list(job):
    cfg = job("[job]\narch_mlp_bot = [32, 64]\n" + two_tables(), "--embedding-dim", "64")
    assert cfg.model.bot_mlp == (32, 64)


def test_a_file_without_tables_keeps_the_flags_one_fused_table(job):
    cfg = job("[job]\nembedding_dim = 16\n")
    assert cfg.tables.fused and cfg.tables.tables[0].dim == 16


def test_the_criteo_example_has_kaggle_s_26_cardinalities(tmp_path):
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "criteo_tables.toml"
    cfg = validate(parse_args(["--config", str(example)]), 3)
    kaggle = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194]
    kaggle += [27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572]
    assert cfg.tables.names == tuple(ALL)
    assert [t.num_embeddings for t in cfg.tables.tables] == kaggle
    assert {t.dim for t in cfg.tables.tables} == {64} and cfg.model.bot_mlp == (512, 256, 64)
    assert all(t.features == (t.name,) for t in cfg.tables.tables)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (two_tables(dims=8), ['"a"', "unknown key 'dims'"]),
        (
            toml_tables({"name": "a"}, {"name": "b", "features": ALL}),
            ['"a"', "features", "missing"],
        ),
        (
            toml_tables({"name": "a", "features": []}, {"name": "b", "features": ALL}),
            ['"a"', "features"],
        ),
        (
            toml_tables({"name": "a", "features": ALL[:2]}, {"name": "a", "features": ALL[2:]}),
            ['"a"', "name", "another table"],
        ),
        (
            toml_tables({"name": "a", "features": ALL[:3]}, {"name": "b", "features": ALL[2:]}),
            ['"b"', "features", "'cat_2' is already in table \"a\""],
        ),
        (  # Criteo data: every feature in a table (synthetic data makes those named)
            toml_tables({"name": "a", "features": ALL[:2]}, {"name": "b", "features": ALL[3:]})
            + CRITEO,
            ["features", "'cat_2'", "in no table"],
        ),
        (
            toml_tables({"name": "a", "features": [*ALL, "item_id"]}) + CRITEO,
            ['"a"', "features", "'item_id' is not a feature"],
        ),
        (toml_tables({"features": ALL}), ["entry 1", "name", "missing"]),
        (toml_tables({"name": "../x", "features": ALL}), ["name", "'../x'"]),
        (two_tables(dim="8"), ['"a"', "dim", "expected an integer"]),
        (two_tables(dim=0), ['"a"', "dim 0", "must be in"]),
        (two_tables(optimizer="adam"), ['"a"', "optimizer 'adam'", "must be one of"]),
        (two_tables(lr=-1.0), ['"a"', "lr -1.0", "positive"]),
        (two_tables(init_scale=True), ['"a"', "init_scale", "expected a number"]),
        (two_tables(admit_after=-2), ['"a"', "admit_after -2"]),
        (two_tables(num_embeddings=1.5), ['"a"', "num_embeddings", "expected an integer"]),
        (two_tables(eps=1e-6), ['"a"', "eps", "only the adagrad optimizer"]),
        (two_tables(pooling="max"), ['"a"', "pooling 'max'"]),
        ("[job]\nbatch_sise = 4\n", ["[job] batch_sise", "unknown key", "not a flag"]),
        (
            '[job]\nbatch_size = "4096"\n',
            ["[job] batch_size", "--batch-size", "expected an integer"],
        ),
        ("[job]\nlr = true\n", ["[job] lr", "expected a number"]),
        ("[job]\nshuffle = 1\n", ["[job] shuffle", "expected true or false"]),
        ('[job]\nsparse_sync = "never"\n', ["[job] sparse_sync", "'never' is not one of"]),
        ("[job]\nmax_ind_range = 10\n", ["[job] max_ind_range", "num_embeddings"]),
        ('[job]\nconfig = "other.toml"\n', ["[job] config"]),
        ("[model]\nbot_mlp = { a = 1 }\n", ["[model] bot_mlp", "a table is not"]),
        ('[data]\nlabels = "y"\n', ["[data] labels", "unknown key", "kind, path, multi_hot_sizes"]),
        ("[jobs]\nx = 1\n", ["unknown key 'jobs'"]),
        ("[[tables]\n", ["not valid TOML"]),
    ],
)
def test_a_bad_job_file_is_refused_naming_the_file_table_and_key(refused, text, words):
    message = refused(text)
    for w in words:
        assert w in message, (w, message)


def test_criteo_hashing_flags_are_refused_beside_a_job_file(refused):
    for flag in (["--max-ind-range", "10"], ["--num-embeddings-per-feature", ",".join(["5"] * 26)]):
        message = refused(two_tables(), "--data", "synthetic", *flag)
        assert flag[0] in message and "num_embeddings" in message


def test_a_missing_job_file_is_named(capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(["--config", "/nonexistent/job.toml"])
    assert info.value.code == 2
    assert "--config /nonexistent/job.toml: no such file" in capsys.readouterr().err


def test_the_job_file_checks_are_one_module_whose_errors_validate_reports_as_they_are(
    refused, job, tmp_path
):
    """cpu_dist/common/job_file_checks.py holds the checks where a job file's tables meet the
    flags; each JobFileError of theirs reaches the user as validate's ConfigError, same text,
    at its place among the flags' checks (both budgets given: that refusal comes first)."""
    from cpu_dist.common.job_file import JobFileError
    from cpu_dist.common.job_file_checks import check_cache_tables, check_rows_budget

    tables = job(two_tables()).tables
    with pytest.raises(JobFileError) as direct:
        check_rows_budget(parse_args(["--ps-memory-rows", "100"]), tables)
    assert refused(two_tables(), "--ps-memory-rows", "100") == str(direct.value)
    adagrad = two_tables(optimizer="adagrad")
    with pytest.raises(JobFileError) as cache:
        check_cache_tables(job(adagrad).tables)
    assert refused(adagrad, "--read-mode", "bagpipe") == str(cache.value)
    check_rows_budget(parse_args(["--ps-memory-rows", "100"]), None)  # no job file: no refusal
    check_cache_tables(None)
    check_cache_tables(tables)  # SGD tables without rules: the cache mirrors them
    from cpu_dist.common.validate import ConfigError

    with pytest.raises(ConfigError, match="give one DRAM budget"):
        job(two_tables(), "--ps-memory-rows", "1", "--ps-memory-bytes", "10")


def test_multi_table_jobs_refuse_a_row_budget(refused, job):
    assert "--ps-memory-bytes" in refused(two_tables(), "--ps-memory-rows", "100")
    cfg = job(two_tables(), "--ps-memory-bytes", "1000000", "--ps-ssd-dir", "ssd")
    assert cfg.storage.memory_bytes == 1000000 and cfg.storage.memory_rows == 0
    from cpu_dist.common.validate import ConfigError

    with pytest.raises(ConfigError, match="--ps-memory-bytes 1000000 needs --ps-ssd-dir"):
        validate(parse_args(["--ps-memory-bytes", "1000000"]), 3)
    with pytest.raises(ConfigError, match="give one DRAM budget"):
        validate(parse_args(["--ps-memory-bytes", "10", "--ps-memory-rows", "1"]), 3)


def test_the_cache_stage_serves_a_job_files_sgd_tables_and_refuses_what_it_cannot_mirror(
    refused, job
):
    cfg = job(two_tables(), "--read-mode", "bagpipe")
    assert cfg.cache is not None and [t.optimizer for t in cfg.tables.tables] == ["sgd", "sgd"]
    # --sparse-optimizer is only the tables' default: tables that say sgd are served
    both_sgd = toml_tables(
        {"name": "a", "features": ALL[:2], "optimizer": "sgd"},
        {"name": "b", "features": ALL[2:], "optimizer": "sgd"},
    )
    cfg = job(both_sgd, "--read-mode", "bagpipe", "--sparse-optimizer", "adagrad")
    assert cfg.cache is not None
    message = refused(two_tables(optimizer="rowwise_adagrad"), "--read-mode", "bagpipe")
    assert "[[tables]] \"a\": optimizer 'rowwise_adagrad'" in message and "'sgd' only" in message
    message = refused(two_tables(expire_after=5), "--read-mode", "bagpipe")
    assert '[[tables]] "a": admit_after / expire_after' in message
    message = refused(two_tables(), "--read-mode", "bagpipe", "--sparse-optimizer", "adagrad")
    assert "[[tables]] \"a\": optimizer 'adagrad'" in message  # the flag's default reached "a"


def test_a_table_may_give_its_own_cache_capacity(refused, job):
    cfg = job(two_tables(cache_capacity=3), "--read-mode", "bagpipe")
    assert [t.cache_capacity for t in cfg.tables.tables] == [3, 0]
    assert job(two_tables(cache_capacity=0)).tables.tables[0].cache_capacity == 0  # a share
    assert "cache_capacity -1: must be in 0.." in refused(two_tables(cache_capacity=-1))
    assert "cache_capacity: expected an integer" in refused(two_tables(cache_capacity=1.5))


def test_the_cache_budget_splits_by_row_bytes_after_the_tables_own():
    from cpu_dist.common.config import CacheConfig
    from cpu_dist.common.tables import JobTables, TableConfig

    def tables(*specs):
        return JobTables(
            tuple(
                TableConfig(name=n, dim=d, features=(f"cat_{i}",), cache_capacity=c)
                for i, (n, d, c) in enumerate(specs)
            ),
            data_features=tuple(f"cat_{i}" for i in range(len(specs))),
        )

    cache = CacheConfig(capacity_units=100)
    # 100 units of 64 rows at dim 16: 409600 bytes; 4 + 16 + 64 floats a row: 336 bytes
    split = cache.table_units(tables(("a", 4, 0), ("b", 16, 0), ("c", 64, 0)), 16)
    assert split == {"a": 19, "b": 19, "c": 19}  # 409600 // (336 * 64): the same rows each
    # "c" takes 10 units of 64 rows of 64 floats (163840 bytes) off the budget first
    split = cache.table_units(tables(("a", 4, 0), ("b", 16, 0), ("c", 64, 10)), 16)
    assert split == {"a": 48, "b": 48, "c": 10}  # (409600 - 163840) // (80 * 64)
    # the flags' one table of the flag's width keeps exactly the flag's units
    assert cache.table_units(tables(("embedding", 16, 0)), 16) == {"embedding": 100}
    # tables that all give their own ignore the budget
    assert cache.table_units(tables(("a", 64, 500), ("b", 4, 1)), 16) == {"a": 500, "b": 1}
    with pytest.raises(ValueError, match="leaves less than 64 rows for each of the tables a, b"):
        cache.table_units(tables(("a", 4, 0), ("b", 16, 0), ("c", 64, 100)), 16)


def test_a_cache_budget_too_small_for_the_tables_is_refused(refused):
    message = refused(
        two_tables(cache_capacity=1000),
        "--read-mode",
        "bagpipe",
        "--optimization-cache-capacity",
        "1",
    )
    assert "--optimization-cache-capacity 1" in message and "tables b" in message


def test_a_tables_cache_capacity_without_the_cache_is_warned_about(tmp_path):
    from cpu_dist.common.config import JobConfig
    from cpu_dist.common.flag_warnings import ineffective_flags

    path = tmp_path / "job.toml"
    path.write_text(two_tables(cache_capacity=2))
    warned = ineffective_flags(
        parse_args(["--config", str(path)]), JobConfig(worker_num=1, num_ps_ranks=1)
    )
    assert f'{path}: [[tables]] "a": cache_capacity has no effect without --read-mode bagpipe' in (
        warned
    )
    assert not ineffective_flags(
        parse_args(["--config", str(path), "--read-mode", "bagpipe"]), JobConfig(1, 1)
    )


def test_adagrad_is_a_sparse_optimizer_flag():
    cfg = validate(parse_args(["--sparse-optimizer", "adagrad"]), 3)
    assert cfg.train.sparse_optimizer == "adagrad" and cfg.tables.tables[0].optimizer == "adagrad"
    assert cfg.tables.specs(0)[0]["eps"] == 1e-8


def test_a_table_default_flag_that_every_table_overrides_is_warned_about(tmp_path):
    from cpu_dist.common.flag_warnings import ineffective_flags

    path = tmp_path / "job.toml"
    path.write_text(two_tables(lr=0.1).replace('name = "b"', 'name = "b"\nlr = 0.2'))
    args = parse_args(["--config", str(path), "--sparse-lr", "0.3", "--init-scale", "0.2"])
    cfg = validate(args, 3)
    warnings = ineffective_flags(args, cfg.job)
    assert warnings == [f"--sparse-lr has no effect: every table of --config {path} sets lr"]


def test_the_tables_are_settings_a_checkpoint_records_and_names(job):
    from cpu_dist.common.setting_flags import setting_flag

    s = job(two_tables(dim=8, lr=0.1), "--embedding-dim", "8").settings()
    assert s["tables.fused"] is False and [t["name"] for t in s["tables.tables"]] == ["a", "b"]
    assert s["tables.tables"][0]["lr"] == 0.1 and s["tables.tables"][0]["features"] == ALL[:2]
    assert setting_flag("tables.tables") == "--config [[tables]]"
