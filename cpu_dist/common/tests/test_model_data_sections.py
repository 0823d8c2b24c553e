"""The model and the data as flags and job-file sections: ``--model``, ``--dcn-num-layers``,
``--dcn-low-rank-dim``, a job file's ``[model]`` (``name`` and the factory's arguments) and
``[data]`` (``kind``, ``bags``, ``weights``): parsing, precedence (command line > section >
default), every refusal (naming the file, the key and the feature) and the settings a
checkpoint records."""

from __future__ import annotations

import json

import pytest

from cpu_dist.common.config import (
    BUILTIN_MODEL_NAMES,
    MAX_BAG_LENGTH,
    DataConfig,
    ModelConfig,
    model_source_problem,
    model_spec_problem,
)
from cpu_dist.common.flags import parse_args
from cpu_dist.common.setting_flags import setting_flag
from cpu_dist.common.validate import ConfigError, validate

pytestmark = pytest.mark.timeout(30)

ALL = [f"cat_{i}" for i in range(26)]


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
    """The one error message a job file gets (validate's, or the parse's exit 2), which
    names the file."""

    def check(text: str, *argv: str) -> str:
        try:
            job(text, *argv)
        except ConfigError as exc:
            message = str(exc)
        except SystemExit as exc:
            assert exc.code == 2
            message = capsys.readouterr().err.strip()
        else:
            raise AssertionError("the job file was accepted")
        assert str(tmp_path / "job.toml") in message, message
        return message

    return check


# --- the flags ------------------------------------------------------------------------------


def test_a_job_without_a_file_trains_dlrm_on_one_hot_features():
    cfg = validate(parse_args([]), 3)
    assert (cfg.model.name, cfg.model.args) == ("dlrm", ()) and BUILTIN_MODEL_NAMES[0] == "dlrm"
    assert (cfg.model.dcn_num_layers, cfg.model.dcn_low_rank_dim) == (3, 512)
    assert (cfg.data.bags, cfg.data.weights) == ((), ())
    assert cfg.model == ModelConfig(
        cfg.model.embedding_dim, cfg.model.bot_mlp, cfg.model.top_mlp
    ) and cfg.data == DataConfig(epochs=cfg.data.epochs)


def test_model_flags_set_the_model_section():
    cfg = validate(
        parse_args(["--model", "dcnv2", "--dcn-num-layers", "2", "--dcn-low-rank-dim", "8"]), 3
    )
    assert (cfg.model.name, cfg.model.dcn_num_layers, cfg.model.dcn_low_rank_dim) == (
        "dcnv2",
        2,
        8,
    )
    # TorchRec dlrm_main's spellings
    cfg = validate(parse_args(["--dcn_num_layers", "5", "--dcn_low_rank_dim", "7"]), 3)
    assert (cfg.model.dcn_num_layers, cfg.model.dcn_low_rank_dim) == (5, 7)


@pytest.mark.parametrize(
    "spec", ["dlrm", "dcnv2", "my_pkg.models:build", "models/two_tower.py:build", "m.py:f"]
)
def test_a_model_spec_of_every_form_is_accepted(spec):
    assert validate(parse_args(["--model", spec]), 3).model.name == spec


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("dlmr", ["--model 'dlmr'", "unknown built-in model", "dlrm, dcnv2"]),
        ("", ["--model ''", "expected a built-in name"]),
        ("my_pkg.models:", ["--model 'my_pkg.models:'", "is not a function name"]),
        ("my pkg:build", ["'my pkg' is neither a dotted module name nor a .py file"]),
    ],
)
def test_a_bad_model_spec_is_refused_before_anything_starts(spec, words):
    with pytest.raises(ConfigError) as err:
        validate(parse_args(["--model", spec]), 3)
    for w in words:
        assert w in str(err.value), (w, str(err.value))


@pytest.mark.parametrize("flag", ["--dcn-num-layers", "--dcn-low-rank-dim"])
def test_cross_network_sizes_must_be_positive(flag):
    with pytest.raises(ConfigError, match=f"{flag} 0: must be >= 1"):
        validate(parse_args(["--model", "dcnv2", flag, "0"]), 3)


@pytest.mark.parametrize(
    ("spec", "ok"),
    [
        ("dlrm", True),
        ("dcnv2", True),
        ("dlmr", False),
        (" ", False),
        ("a.b:c", True),
        ("a.b:", False),
        (":f", False),
        ("x.py:f", True),
        ("d/x:f", True),
        ("C:\\m\\x.py:build", True),
        ("a b:f", False),
        ("a.b:c d", False),
        ("1a:f", False),
        ("a..b:f", False),
        ("a:b:c", False),
    ],
)
def test_the_spec_syntax_is_the_model_factory_s(spec, ok):
    """``model_spec_problem`` restates ``cpu_dist.models.factory.parse_model_spec``'s rules
    (the flags cannot import torch, nor may common's tests import the models package, so a
    comparison with the factory itself belongs to the models' tests)."""
    assert (model_spec_problem(spec) is None) == ok, model_spec_problem(spec)


def test_a_user_model_s_missing_file_or_package_is_found_without_importing(tmp_path, monkeypatch):
    """What the launcher checks before MPI starts (``launcher.py`` prints it once, exit 2):
    the file of a file spec, the top-level package of a module spec; what needs an import
    (a submodule, the function) and built-in names are left to the factory."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.py").write_text("def build(tables, dense_features): ...\n")
    (tmp_path / "models").mkdir()
    assert model_source_problem("mine.py:build") is None  # relative to the working directory
    assert model_source_problem("mine.py:no_such_function") is None
    assert "nope.py does not exist (resolved: " in str(model_source_problem("nope.py:build"))
    assert "./models is not a file" in str(model_source_problem("./models:build"))
    assert "no module named 'no_such_pkg_48'" in str(
        model_source_problem("no_such_pkg_48.models:build")
    )
    assert model_source_problem("json.no_such_submodule:build") is None  # needs an import
    for spec in ("dlrm", "dcnv2", "dlmr", "a b:f"):  # built-in, or model_spec_problem's to say
        assert model_source_problem(spec) is None


def test_cross_network_flags_warn_without_dcnv2():
    from cpu_dist.common.flag_warnings import ineffective_flags

    args = parse_args(["--dcn-num-layers", "2"])
    assert "--dcn-num-layers has no effect without --model dcnv2" in ineffective_flags(
        args, validate(args, 3).job
    )
    args = parse_args(["--model", "dcnv2", "--dcn-num-layers", "2", "--dcn-low-rank-dim", "4"])
    assert ineffective_flags(args, validate(args, 3).job) == []


def test_help_names_the_model_flags(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for words in ("--model NAME", "path/to/file.py:FUNC", "--dcn-num-layers N", "[model] name"):
        assert words in text, words
    assert "--dcn_low_rank_dim" in text and "dlrm_main" in text


# --- [model] ---------------------------------------------------------------------------------

MODEL = """[model]
name = "dcnv2"
low_rank_dim = 8
widths = [4, [2, 1]]
act = "relu"
use_bias = true
scale = 0.5
"""


def test_model_section_names_the_model_and_its_arguments_sorted(job):
    cfg = job(MODEL)
    assert cfg.model.name == "dcnv2"
    assert cfg.model.args == (
        ("act", "relu"),
        ("low_rank_dim", 8),
        ("scale", 0.5),
        ("use_bias", True),
        ("widths", (4, (2, 1))),
    )
    hash(cfg.model)  # a frozen section stays hashable: arrays are tuples


def test_the_command_line_model_beats_the_file_s_name_and_the_name_beats_the_default(job):
    assert job('[model]\nname = "dcnv2"\n').model.name == "dcnv2"
    cfg = job(MODEL, "--model", "dlrm")
    assert cfg.model.name == "dlrm" and dict(cfg.model.args)["low_rank_dim"] == 8
    assert job("[model]\nlow_rank_dim = 8\n").model.name == "dlrm"
    assert job("[job]\ndcn_num_layers = 4\n", "--model", "dcnv2").model.dcn_num_layers == 4


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[model]\nname = 3\n", ["[model] name (--model)", "expected a string"]),
        ('[model]\nname = "dlmr"\n', ["[model] name (--model) 'dlmr'", "unknown built-in"]),
        ('[model]\nname = "pkg.mod:"\n', ["[model] name", "not a function name"]),
        ("[model]\nopts = { a = 1 }\n", ["[model] opts", "a table is not a model argument"]),
        ("[model.opts]\na = 1\n", ["[model] opts", "a table is not a model argument"]),
        ("[model]\nlayers = [{ a = 1 }]\n", ["[model] layers", "a table is not"]),
        ("[model]\nwhen = 2024-01-01\n", ["[model] when", "a date or time"]),
        ("[model]\nscale = nan\n", ["[model] scale", "finite number"]),
        ("[model]\nscale = inf\n", ["[model] scale", "finite number"]),
        ('[model]\n"low-rank" = 8\n', ["[model] 'low-rank'", "not a Python identifier"]),
        ("[model]\nclass = 1\n", ["[model] 'class'", "not a Python identifier"]),
        ("[model]\ntables = 1\n", ["[model] tables", "passes the factory its tables"]),
        ("[model]\ndense_features = 13\n", ["[model] dense_features", "not a [model] key"]),
        ('[job]\nmodel = "dcnv2"\n', ["[job] model", "[model] name", "set it there"]),
        ("model = 1\n", ["model must be a table"]),
    ],
)
def test_a_bad_model_section_is_refused_naming_the_file_and_key(refused, text, words):
    message = refused(text)
    for w in words:
        assert w in message, (w, message)


# --- [data] ----------------------------------------------------------------------------------

DATA = """[data]
kind = "synthetic"
bags = { cat_3 = [0, 20], cat_1 = [1, 5] }
weights = ["cat_3", "cat_0"]
"""


def test_data_section_makes_features_multi_hot_and_weighted(job):
    cfg = job(DATA)
    assert cfg.data.kind == "synthetic"
    assert cfg.data.bags == (("cat_1", 1, 5), ("cat_3", 0, 20))
    assert cfg.data.weights == ("cat_0", "cat_3")
    cfg = job(f"[data]\nbags = {{ cat_25 = [{MAX_BAG_LENGTH}, {MAX_BAG_LENGTH}] }}\n")
    assert cfg.data.bags == (("cat_25", MAX_BAG_LENGTH, MAX_BAG_LENGTH),)


def test_data_kind_is_the_data_flag_and_the_command_line_beats_it(job, tmp_path):
    with pytest.raises(ConfigError, match="--data criteo needs --data-path"):
        job('[data]\nkind = "criteo"\n')  # the file's kind took effect
    tsv = tmp_path / "day_0.tsv"
    tsv.write_text("")
    assert job('[data]\nkind = "criteo"\n', "--data-path", str(tsv)).data.kind == "criteo"
    assert job('[data]\nkind = "criteo"\n', "--data", "synthetic").data.kind == "synthetic"
    assert job("[data]\n").data.kind == "synthetic"  # neither: the default


def test_bags_are_checked_against_the_job_s_tables_features(job):
    tables = '[[tables]]\nname = "a"\nfeatures = [{}]\n'.format(", ".join(f'"{f}"' for f in ALL))
    cfg = job(tables + DATA)
    assert cfg.tables.data_features == tuple(ALL) and cfg.data.bags[0] == ("cat_1", 1, 5)


def test_bags_are_allowed_with_the_cache_stage(job):
    cfg = job(DATA, "--read-mode", "bagpipe")
    assert cfg.cache is not None and cfg.data.bags == (("cat_1", 1, 5), ("cat_3", 0, 20))


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('[data]\nkind = "orc"\n', ["[data] kind (--data)", "'orc' is not one of"]),
        ("[data]\nkind = 1\n", ["[data] kind (--data)", "expected a string"]),
        ('[data]\nlabels = "x"\n', ["[data] labels", "unknown key", "kind, path"]),
        ('[data]\nlabel = "y"\n', ["[data] label", "Parquet's columns"]),
        ('[data]\nweights = { cat_0 = "w" }\n', ["[data] weights", "'cat_0' = 'w'", "parquet"]),
        ('[data]\nmulti_hot_sizes = ["a"]\n', ["[data] multi_hot_sizes", "array of integers"]),
        ("[data]\nbags = [1, 2]\n", ["[data] bags", "expected a table of FEATURE = [MIN, MAX]"]),
        ("[data]\nbags = { cat_2 = 5 }\n", ["[data] bags", "'cat_2'", "expected [MIN, MAX]"]),
        ("[data]\nbags = { cat_2 = [1, 2, 3] }\n", ["[data] bags", "'cat_2'", "3 values"]),
        ("[data]\nbags = { cat_2 = [1, 2.5] }\n", ["[data] bags", "'cat_2'", "two integers"]),
        ("[data]\nbags = { cat_2 = [true, 2] }\n", ["[data] bags", "'cat_2'", "two integers"]),
        ("[data]\nbags = { cat_2 = [5, 2] }\n", ["[data] bags", "'cat_2'", "[5, 2]", "MIN <= MAX"]),
        ("[data]\nbags = { cat_2 = [-1, 2] }\n", ["[data] bags", "'cat_2'", "0 <= MIN"]),
        (
            f"[data]\nbags = {{ cat_2 = [1, {MAX_BAG_LENGTH + 1}] }}\n",
            ["[data] bags", "'cat_2'", f"MAX <= {MAX_BAG_LENGTH}"],
        ),
        (
            "[data]\nbags = { cat_2 = [0, 0] }\n",
            ["[data] bags", "'cat_2'", "every bag would be empty"],
        ),
        (
            "[data]\nbags = { item_id = [1, 2] }\n",
            ["[data] bags", "'item_id' is not a feature of the data", "cat_0 ... cat_25"],
        ),
        ('[data]\nweights = "cat_0"\n', ["[data] weights", "expected an array of feature"]),
        ("[data]\nweights = [1]\n", ["[data] weights", "expected an array of feature names"]),
        (
            '[data]\nweights = ["cat_1", "cat_0", "cat_1"]\n',
            ["[data] weights", "'cat_1' listed twice"],
        ),
        (
            '[data]\nweights = ["cat_0", "user"]\n',
            ["[data] weights", "'user' is not a feature of the data"],
        ),
        ('[job]\ndata = "criteo"\n', ["[job] data", "[data] kind", "set it there"]),
        ('data = "x"\n', ["data must be a table"]),
    ],
)
def test_a_bad_data_section_is_refused_naming_the_file_key_and_feature(refused, text, words):
    message = refused(text)
    for w in words:
        assert w in message, (w, message)


@pytest.mark.parametrize(
    ("section", "key", "feature"),
    [("bags = { cat_4 = [1, 3] }", "bags", "cat_4"), ('weights = ["cat_7"]', "weights", "cat_7")],
)
def test_bags_and_weights_need_synthetic_data(refused, tmp_path, section, key, feature):
    tsv = tmp_path / "day_0.tsv"
    tsv.write_text("")
    message = refused(f"[data]\n{section}\n", "--data", "criteo", "--data-path", str(tsv))
    for w in (f"[data] {key}", repr(feature), "need --data synthetic, not --data criteo"):
        assert w in message, (w, message)
    assert "Criteo data is made multi-hot by --multi-hot-sizes" in message


# --- the settings a checkpoint records -------------------------------------------------------


def test_model_and_data_settings_survive_a_json_round_trip(job):
    cfg = job(MODEL + "\n" + DATA, "--dcn-num-layers", "2", "--dcn-low-rank-dim", "16")
    s = cfg.settings()
    assert s["model.name"] == "dcnv2"
    assert s["model.args"] == [
        ["act", "relu"],
        ["low_rank_dim", 8],
        ["scale", 0.5],
        ["use_bias", True],
        ["widths", [4, [2, 1]]],
    ]
    assert (s["model.dcn_num_layers"], s["model.dcn_low_rank_dim"]) == (2, 16)
    assert s["data.bags"] == [["cat_1", 1, 5], ["cat_3", 0, 20]]
    assert s["data.weights"] == ["cat_0", "cat_3"]
    # what a manifest writes and reads back compares equal, setting by setting
    assert json.loads(json.dumps(s)) == s
    other = job('[model]\nname = "dcnv2"\nlow_rank_dim = 4\n').settings()
    assert other["model.args"] != s["model.args"] and other["data.bags"] == []
    for key, flag in (
        ("model.name", "--model"),
        ("model.args", "--config [model]"),
        ("model.dcn_num_layers", "--dcn-num-layers"),
        ("model.dcn_low_rank_dim", "--dcn-low-rank-dim"),
        ("data.bags", "--config [data] bags"),
        ("data.weights", "--config [data] weights"),
    ):
        assert setting_flag(key) == flag
