"""PhaseTimer: seconds per phase, also when the timed body raises."""

import time

import pytest

from cpu_dist.common.timing import PhaseTimer

pytestmark = pytest.mark.timeout(30)


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_phase_timer_accumulates_per_phase():
    t = PhaseTimer()
    for _ in range(2):
        with t("pull"):
            _busy(0.005)
    with t("forward"):
        with t("backward"):
            _busy(0.002)
    t.add("commit_wait", 1.5)
    tot = t.totals()
    assert list(tot) == ["pull", "backward", "forward", "commit_wait"]
    assert 0.01 <= tot["pull"] < 1.0
    assert tot["forward"] >= tot["backward"] >= 0.002
    assert tot["commit_wait"] == 1.5


def test_phase_timer_counts_time_when_the_body_raises():
    t = PhaseTimer()
    with pytest.raises(RuntimeError):
        with t("push"):
            raise RuntimeError("boom")
    assert t.totals()["push"] >= 0.0
