"""The dense optimizer's settings (cpu_dist/common/dense_optimizer.py): torch's defaults, every
refusal one line naming the flag, the job file's ``[optimizer]`` and the start line's words."""

from __future__ import annotations

import inspect

import pytest
import torch

from cpu_dist.common.config import TrainConfig
from cpu_dist.common.dense_optimizer import DENSE_OPTIMIZERS, dense_optimizer_args, describe
from cpu_dist.common.flags import parse_args
from cpu_dist.common.validate import ConfigError, validate

pytestmark = pytest.mark.timeout(30)
TORCH = {
    "sgd": torch.optim.SGD,
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "adagrad": torch.optim.Adagrad,
}


def train_config(*argv: str) -> TrainConfig:
    return validate(parse_args(["--worker-num", "1", *argv]), 2).train


@pytest.mark.parametrize("name", list(DENSE_OPTIMIZERS))
def test_the_defaults_are_torchs(name):
    signature = inspect.signature(TORCH[name])
    for setting, value in dense_optimizer_args(name, {}):
        assert signature.parameters[setting].default == value, (name, setting)


def test_flags_and_defaults_resolve_to_torchs_keyword_arguments():
    assert train_config().dense_optimizer_args == TrainConfig.dense_optimizer_args
    adamw = train_config("--dense-optimizer", "adamw").dense_optimizer_args
    assert dict(adamw) == {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
    adam = train_config("--dense-optimizer", "adam", "--weight-decay", "0.01", "--betas", "0.8,0.9")
    assert dict(adam.dense_optimizer_args) == {
        "betas": (0.8, 0.9),
        "eps": 1e-8,
        "weight_decay": 0.01,
    }
    sgd = train_config("--momentum", "0.9").dense_optimizer_args
    assert dict(sgd) == {"momentum": 0.9, "weight_decay": 0.0}


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--dense-optimizer", "adam", "--betas", "0.9"], "--betas 0.9: expected two numbers"),
        (["--dense-optimizer", "adam", "--betas", "a,b"], "--betas a,b: expected two numbers"),
        (["--dense-optimizer", "adam", "--betas", "0.9,1"], "--betas 0.9,1.0: each beta must be"),
        (["--momentum", "1.5"], "--momentum 1.5: must be in [0, 1)"),
        (["--weight-decay", "-0.1"], "--weight-decay -0.1: must be a number >= 0"),
        (["--weight-decay", "nan"], "--weight-decay nan: must be a number >= 0"),
        (["--dense-optimizer", "adagrad", "--eps", "0"], "--eps 0.0: must be a positive number"),
        (["--betas", "0.9,0.99"], "--dense-optimizer sgd takes no betas (only adam and adamw"),
        (
            ["--dense-optimizer", "adam", "--momentum", "0.9"],
            "--momentum 0.9: --dense-optimizer adam takes no momentum (only sgd takes it)",
        ),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_flag(argv, message):
    with pytest.raises(ConfigError) as e:
        train_config(*argv)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_an_unknown_optimizer_is_one_line_not_a_usage_dump(capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["--dense-optimizer", "lamb"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err.count("\n") == 1 and "usage:" not in err, err
    assert "--dense-optimizer: invalid choice: 'lamb'" in err and "'adagrad'" in err


def test_the_job_files_optimizer_section(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('[optimizer]\nname = "adam"\nbetas = [0.8, 0.99]\nweight_decay = 0.01\n')
    t = train_config("--config", str(job))
    assert t.dense_optimizer == "adam"
    assert dict(t.dense_optimizer_args) == {"betas": (0.8, 0.99), "eps": 1e-8, "weight_decay": 0.01}
    t = train_config("--config", str(job), "--weight-decay", "0.2")  # the command line wins
    assert dict(t.dense_optimizer_args)["weight_decay"] == 0.2


@pytest.mark.parametrize(
    "text,message",
    [
        ("[optimizer]\nlr = 0.1\n", "[optimizer] lr: unknown key"),
        ("[optimizer]\nbetas = [0.9]\n", "[optimizer] betas (--betas): expected two numbers"),
        ('[optimizer]\nname = "lamb"\n', "[optimizer] name (--dense-optimizer): 'lamb' is not"),
        ('[optimizer]\neps = "small"\n', "[optimizer] eps (--eps): expected a number"),
        ("[job]\nweight_decay = 0.1\n", "[job] weight_decay: has a key of its own, [optimizer]"),
    ],
)
def test_a_bad_optimizer_section_is_named(tmp_path, capsys, text, message):
    job = tmp_path / "job.toml"
    job.write_text(text)
    with pytest.raises(SystemExit) as e:
        parse_args(["--config", str(job)])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_the_start_line_says_every_setting():
    args = dense_optimizer_args("adamw", {"betas": "0.8,0.99"})
    assert describe("adamw", 0.1, args) == (
        "adamw (lr 0.1, betas 0.8,0.99, eps 1e-08, weight_decay 0.01)"
    )
