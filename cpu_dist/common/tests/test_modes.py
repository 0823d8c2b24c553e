"""The table of modes (``cpu_dist.common.modes``) is the one source: validation refuses what a
chosen row refuses, in the row's words, the warnings name the flags it ties to a mode, the
README's table of modes is ``render(MODES)``, and patching one row changes all of them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cpu_dist.common import modes
from cpu_dist.common.config import JobConfig
from cpu_dist.common.flag_warnings import ineffective_flags
from cpu_dist.common.flags import parse_args
from cpu_dist.common.validate import ConfigError, validate

pytestmark = pytest.mark.timeout(30)
README = Path(__file__).resolve().parents[3] / "README.md"

# The flags that give each fact a value (the tests' own vocabulary, not the table's).
SET = {
    ("read_mode", "bagpipe"): ["--read-mode", "bagpipe"],
    ("rules", "admit"): ["--ps-admit-after", "3"],
    ("rules", "expire"): ["--ps-expire-after", "3"],
    ("compression", "fp16"): ["--ps-compression", "fp16"],
    ("compression", "int8"): ["--ps-compression", "int8"],
    ("sparse_sync", "async"): ["--sparse-sync", "async"],
    ("optimizer", "adaptive"): ["--sparse-optimizer", "adagrad"],
}
GIVE = {
    "max_staleness": "3",
    "optimization_cache_capacity": "16",
    "optimization_bypass_below": ".1",
}


def refusal_cases() -> list[tuple[str, modes.Refusal, str]]:
    """(row, refusal, a value it refuses) for every refusal of the table."""
    return [
        (m.strategy, r, v)
        for m in modes.MODES
        for r in m.refuses
        for v in modes.FACTS[r.fact][1]
        if v not in r.allowed
    ]


def choosing(strategy: str) -> list[str]:
    """Flags that choose a row outright (only rows with refusals are chosen so)."""
    row = modes.mode_named(strategy)
    return [x for r in row.requires for v in r.values for x in SET[(r.fact, v)]]


@pytest.mark.parametrize(
    "strategy,refused,value", refusal_cases(), ids=lambda x: getattr(x, "fact", str(x))
)
def test_validation_stops_each_refusal_of_the_table_in_its_words(strategy, refused, value):
    a = parse_args(choosing(strategy) + SET[(refused.fact, value)])
    with pytest.raises(ConfigError) as e:
        validate(a, 3)
    assert str(e.value) == refused.message.format(**vars(a))


def test_a_patched_row_changes_validation_and_the_rendered_table(monkeypatch):
    """The cache row made to accept fp16: fp16 validates, int8 meets the new words, and the
    README's table would say so."""
    fp16 = parse_args(["--read-mode", "bagpipe", "--ps-compression", "fp16"])
    with pytest.raises(ConfigError, match="--ps-compression fp16"):
        validate(fp16, 3)
    before = modes.render()
    rows = list(modes.MODES)
    cache = rows[0]
    assert cache.strategy == "cache"
    refuses = tuple(
        dataclasses.replace(r, allowed=("none", "fp16"), message="patched: {ps_compression}")
        if r.fact == "compression"
        else r
        for r in cache.refuses
    )
    rows[0] = dataclasses.replace(cache, refuses=refuses)
    monkeypatch.setattr(modes, "MODES", tuple(rows))
    assert validate(fp16, 3).cache is not None
    with pytest.raises(ConfigError, match=r"^patched: int8$"):
        validate(parse_args(["--read-mode", "bagpipe", "--ps-compression", "int8"]), 3)
    after = modes.render()
    assert "`--ps-compression` fp16 or int8" in before
    assert "`--ps-compression` int8;" in after and "fp16 or int8" not in after


def test_a_job_files_table_meets_the_rows_table_refusals():
    class Table:
        optimizer, admit_after, expire_after = "sgd", 0, 0

    assert modes.table_refusal("cache", Table(), "T") is None
    Table.expire_after = 2
    rules = next(r for r in modes.mode_named("cache").refuses if r.fact == "rules")
    assert modes.table_refusal("cache", Table(), "T") == rules.table_message.format(where="T")


@pytest.mark.parametrize("flag", modes.MODE_FLAGS, ids=lambda f: f.dest)
def test_a_flag_the_table_ties_to_a_mode_is_warned_about_elsewhere(flag):
    a = parse_args([flag.flag, GIVE[flag.dest]])
    warning = f"{flag.flag} has no effect without {flag.needs}"
    assert warning in ineffective_flags(a, JobConfig(2, 1))
    wanted = [x for v in flag.values for x in SET[(flag.fact, v)]]
    assert warning not in ineffective_flags(
        parse_args([flag.flag, GIVE[flag.dest], *wanted]), JobConfig(2, 1)
    )


def test_the_readme_table_of_modes_is_render_of_the_table():
    """Edit ``MODES``, then ``python -m cpu_dist.common.modes --update README.md``."""
    text = README.read_text()
    assert modes.block_of(text) == modes.render()
    assert modes.replace_block(text, modes.render()) == text


def test_update_rewrites_only_the_block(tmp_path, capsys):
    doc = tmp_path / "doc.md"
    doc.write_text(f"head\n{modes.BEGIN}\nold\n{modes.END}\ntail\n")
    assert modes.main(["--update", str(doc)]) == 0
    assert doc.read_text() == f"head\n{modes.BEGIN}\n{modes.render()}{modes.END}\ntail\n"
    (tmp_path / "none.md").write_text("no block")
    assert modes.main(["--update", str(tmp_path / "none.md")]) == 2
    assert "no <!-- modes:begin -->" in capsys.readouterr().err
