"""scripts/bench_compare.py without building anything: how figures are read from a
benchmark's output, medians and ratios, interleaved rounds, the result line, and the errors
that come before a build (an unknown revision, a benchmark one side lacks)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "bench_compare.py"


@pytest.fixture(scope="module")
def bc():
    spec = importlib.util.spec_from_file_location("bench_compare", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_compare"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_figures_are_the_numbers_of_the_last_json_line(bc):
    out = "\n".join(
        [
            "case 1 {not json}",
            json.dumps({"early": 1.0}),  # an earlier JSON line is progress, not the result
            json.dumps(
                {
                    "rows_per_s": 12.5,
                    "count": 3,
                    "phase": {"data": 0.25, "deep": {"x": 2}},
                    "label": "tcp",
                    "flag": True,
                    "missing": None,
                    "series": [1, 2],
                }
            ),
            "",
        ]
    )
    assert bc.figures(out) == {
        "rows_per_s": 12.5,
        "count": 3.0,
        "phase.data": 0.25,
        "phase.deep.x": 2.0,
    }


@pytest.mark.parametrize(
    "out,why",
    [("", "printed nothing"), ("a\nb=1\n", "not a JSON object"), ("[1, 2]\n", "not an object")],
)
def test_output_without_a_result_line_is_refused(bc, out, why):
    with pytest.raises(ValueError, match=why):
        bc.figures(out)


def test_summary_takes_medians_over_the_keys_both_sides_print_every_round(bc):
    head = [{"a": 1.0, "b": 10.0, "h": 1.0}, {"a": 3.0, "b": 30.0, "h": 1.0}, {"a": 2.0}]
    base = [{"a": 4.0, "b": 0.0, "z": 5.0}, {"a": 8.0, "b": 0.0, "z": 5.0}, {"a": 6.0, "b": 0.0}]
    got = bc.summary("v1", head, base)
    assert got == {
        "base": "v1",
        "rounds": 3,
        "keys": {
            "a": {
                "head": 2.0,
                "base": 6.0,
                "ratio": round(2 / 6, 4),
                "spread": [round(1 / 4, 4), round(3 / 8, 4)],  # rounds 1/4, 3/8, 2/6
            }
        },
    }
    # b is missing from head's third round; with it there, a zero base median has no ratio.
    head[2]["b"] = 20.0
    assert bc.summary("v1", head, base)["keys"]["b"] == {
        "head": 20.0,
        "base": 0.0,
        "ratio": None,
        "spread": None,
    }
    assert json.loads(json.dumps(got)) == got
    assert bc.one_sided([{"a": 1.0, "h": 2.0}], [{"a": 1.0, "z": 3.0}]) == [
        "only in head: h",
        "only in base: z",
    ]


def test_rounds_interleave_the_sides_and_each_runs_its_own_copy(bc, tmp_path):
    order = tmp_path / "order.txt"
    sides = []
    for name, value in (("base", 4.0), ("head", 2.0)):
        root = tmp_path / name
        (root / "scripts").mkdir(parents=True)
        (root / "scripts" / "bench.py").write_text(
            "import json, sys\n"
            f"open({str(order)!r}, 'a').write({name!r} + ' ' + ' '.join(sys.argv[1:]) + '\\n')\n"
            f"print(json.dumps({{'rate': {value} * int(sys.argv[1]), 'name': {name!r}}}))\n"
        )
        sides.append(bc.Side(name, root, {}))
    runs = bc.interleave(sides, "scripts/bench.py", ["3"], sys.executable, 2, tmp_path / "logs", 30)
    assert order.read_text().split("\n")[:-1] == ["base 3", "head 3", "base 3", "head 3"]
    assert runs == {"base": [{"rate": 12.0}] * 2, "head": [{"rate": 6.0}] * 2}
    assert (tmp_path / "logs" / "round2-head.out").read_text().startswith('{"rate": 6.0')


def test_a_failing_run_is_one_error_naming_side_round_and_cause(bc, tmp_path):
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "bench.py").write_text("raise SystemExit('no shard today')\n")
    side = bc.Side("base", tmp_path, {})
    with pytest.raises(
        bc.CompareError,
        match=r"base run of scripts/bench.py \(round 1\) failed "
        r"with exit 1: no shard today",
    ):
        bc.interleave([side], "scripts/bench.py", [], sys.executable, 1, tmp_path / "logs", 30)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60
    )


def test_an_unknown_revision_is_a_one_line_error():
    r = run("no-such-rev-h3", "--", "scripts/bench_ps.py")
    assert r.returncode == 2
    assert r.stderr == "bench_compare: error: unknown revision 'no-such-rev-h3' " + (
        f"(not a commit of {ROOT})\n"
    )


def test_a_benchmark_the_revision_lacks_is_a_one_line_error():
    first = subprocess.run(
        ["git", "rev-list", "--max-parents=0", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[0]
    r = run(first, "--", str(ROOT / "scripts" / "bench_compare.py"))
    assert r.returncode == 2
    assert r.stderr.startswith("bench_compare: error: scripts/bench_compare.py does not exist in ")
    assert len(r.stderr.splitlines()) == 1
    r = run("HEAD", "--", "scripts/bench_nothing.py")
    assert r.returncode == 2 and "does not exist in the working tree" in r.stderr


def test_the_benchmark_goes_after_the_separator():
    r = run("HEAD", "scripts/bench_ps.py")
    assert r.returncode == 2 and "after --" in r.stderr.splitlines()[-1]
