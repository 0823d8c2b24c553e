"""The dense optimizer's settings (``--dense-optimizer``, ``--weight-decay``, ``--betas``,
``--momentum``, ``--eps``; a job file's ``[optimizer]``), checked and resolved before anything
starts.

The optimizers are torch's own (``torch.optim.SGD``, ``Adam``, ``AdamW``, ``Adagrad``): this
module only decides the keyword arguments they get, so that the job's workers, both dense paths
(all-reduce and ZeRO-1) and the single-process reference build the same optimizer.  A setting
the user leaves out takes torch's default (``adamw``'s weight decay is 0.01, as in torch); a
setting the chosen optimizer does not take is refused rather than ignored.  No torch import
here: every rank checks the flags before MPI and torch start.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from cpu_dist.common.config_errors import ConfigError

# Each optimizer's settings we expose, with torch's defaults (torch 2.13; a unit test compares
# them with torch.optim's signatures).  The order is the start line's.
DENSE_OPTIMIZERS: Mapping[str, Mapping[str, object]] = {
    "sgd": {"momentum": 0.0, "weight_decay": 0.0},
    "adam": {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0},
    "adamw": {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01},
    "adagrad": {"eps": 1e-10, "weight_decay": 0.0},
}
# setting -> its flag
FLAGS = {
    "weight_decay": "--weight-decay",
    "betas": "--betas",
    "momentum": "--momentum",
    "eps": "--eps",
}

DenseArgs = tuple[tuple[str, object], ...]


def parse_betas(text: str) -> tuple[float, float]:
    """``--betas B1,B2`` as two floats, or ConfigError naming the flag."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        values = ()
    if len(values) != 2:
        raise ConfigError(f"--betas {text}: expected two numbers B1,B2 (torch's: 0.9,0.999)")
    return values[0], values[1]


def _check(setting: str, value: object) -> None:
    """One setting's range (torch's, with eps > 0: a zero eps divides by zero)."""
    flag = FLAGS[setting]
    if setting == "betas":
        assert isinstance(value, tuple)
        for b in value:
            if not (math.isfinite(b) and 0 <= b < 1):
                shown = ",".join(repr(v) for v in value)
                raise ConfigError(f"--betas {shown}: each beta must be in [0, 1)")
        return
    assert isinstance(value, float)
    if setting == "momentum" and not (math.isfinite(value) and 0 <= value < 1):
        raise ConfigError(f"{flag} {value}: must be in [0, 1)")
    if setting == "weight_decay" and not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"{flag} {value}: must be a number >= 0")
    if setting == "eps" and not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{flag} {value}: must be a positive number")


def dense_optimizer_args(name: str, given: Mapping[str, str | float | None]) -> DenseArgs:
    """The keyword arguments of ``name``'s torch optimizer: each setting ``given`` (None: not
    given; ``betas`` as ``"B1,B2"``) checked, the rest torch's defaults; a setting the
    optimizer does not take raises ConfigError naming the flag and the optimizers that do."""
    if name not in DENSE_OPTIMIZERS:
        choices = ", ".join(DENSE_OPTIMIZERS)
        raise ConfigError(f"--dense-optimizer {name}: expected one of {choices}")
    defaults = DENSE_OPTIMIZERS[name]
    for setting, value in given.items():
        if value is not None and setting not in defaults:
            takers = [n for n, d in DENSE_OPTIMIZERS.items() if setting in d]
            verb = "takes" if len(takers) == 1 else "take"
            raise ConfigError(
                f"{FLAGS[setting]} {value}: --dense-optimizer {name} takes no {setting} (only "
                f"{' and '.join(takers)} {verb} it)"
            )
    out: list[tuple[str, object]] = []
    for setting, default in defaults.items():
        value = given.get(setting)
        resolved: object = default
        if value is not None:
            resolved = parse_betas(str(value)) if setting == "betas" else float(value)
        _check(setting, resolved)
        out.append((setting, resolved))
    return tuple(out)


def _shown(value: object) -> str:
    if isinstance(value, tuple):
        return ",".join(f"{v:g}" for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def describe(name: str, lr: float, args: DenseArgs) -> str:
    """The start line's words: ``adam (lr 0.1, betas 0.9,0.999, eps 1e-08, weight_decay 0)``."""
    settings = "".join(f", {k} {_shown(v)}" for k, v in args)
    return f"{name} (lr {lr:g}{settings})"
