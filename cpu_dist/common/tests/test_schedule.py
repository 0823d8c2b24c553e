"""The learning-rate schedule, against MLPerf's DLRM-DCNv2 reference formulas, and its
flags' checks."""

from __future__ import annotations

import pytest

from cpu_dist.common.flags import parse_args
from cpu_dist.common.schedule import LrSchedule
from cpu_dist.common.validate import ConfigError, validate


def mlperf(base: float, n: int, warmup: int, start: int, steps: int) -> float:
    """TorchRec dlrm_main's LRPolicyScheduler at step count n (warmup and decay parts)."""
    if n < warmup:
        return base * (1.0 - (warmup - n) / warmup)
    if start <= n < start + steps:
        return max(1e-7, base * ((steps - (n - start)) / steps) ** 2)
    raise AssertionError("outside the parts compared")


def test_warmup_and_decay_follow_the_reference_formulas():
    s = LrSchedule(warmup_steps=4, decay_start=6, decay_steps=5)
    for step in range(3):  # counts 1..3 warm up
        assert s.rate(0.5, step) == pytest.approx(mlperf(0.5, step + 1, 4, 6, 5), rel=1e-15)
    assert [s.rate(0.5, t) for t in (3, 4)] == [0.5, 0.5]  # counts 4, 5: the base
    for step in range(5, 10):  # counts 6..10 decay
        assert s.rate(0.5, step) == mlperf(0.5, step + 1, 4, 6, 5)
    last = s.rate(0.5, 9)
    assert last == 0.5 * (1 / 5) ** 2 and s.rate(0.5, 10) == last == s.rate(0.5, 500)


def test_a_decay_stops_at_its_floor_and_a_constant_schedule_is_the_base():
    s = LrSchedule(decay_start=1, decay_steps=10, power=3.0, floor=0.01)
    assert s.rate(0.1, 8) == 0.01 and s.rate(0.1, 0) == 0.1  # count 1: (10/10)^3
    assert LrSchedule().constant and LrSchedule().rate(0.3, 12345) == 0.3
    assert not s.constant and not LrSchedule(warmup_steps=2).constant


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--lr-warmup-steps", "-1"], "--lr-warmup-steps -1: must be >= 0"),
        (
            ["--lr-warmup-steps", "10", "--lr-decay-start", "5", "--lr-decay-steps", "3"],
            "--lr-decay-start 5: the decay must start after the warmup (--lr-warmup-steps 10)",
        ),
        (["--lr-decay-steps", "3", "--lr-decay-power", "0"], "--lr-decay-power 0.0: must be"),
        (["--lr-decay-steps", "3", "--lr-min", "-1"], "--lr-min -1.0: must be a number >= 0"),
    ],
)
def test_bad_schedules_are_refused_naming_the_flag(argv, words):
    with pytest.raises(ConfigError, match=None) as info:
        validate(parse_args(argv), 3)
    assert words in str(info.value)


def test_the_flags_make_the_configs_schedule():
    argv = ["--lr-warmup-steps", "2", "--lr-decay-start", "3", "--lr-decay-steps", "4"]
    cfg = validate(parse_args([*argv, "--lr-min", "0.001"]), 3)
    assert cfg.train.schedule == LrSchedule(2, 3, 4, 2.0, 0.001)
    assert validate(parse_args([]), 3).train.schedule.constant
