"""What one phase of scripts/test.sh ran, read from its JUnit XML (pytest, xunit1 family).

    suite_report.py PHASE XML SKIPS

prints ``passed failed skipped`` for the phase (errors count as failures) and appends one
entry per skipped test to the file SKIPS: ``[PHASE] path::test: reason``, a reason of several
lines indented below it.  test.sh prints that file before its last line, so a run shows what it
did not run and why, not only how much.  An XML file that is missing or unreadable (the phase
crashed before pytest wrote it) reads as ``0 1 0``: one failure, nothing counted as passed.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

MAX_REASON_LINES = 20  # a long reason (an installer's stderr) is cut, the rest is in the XML


@dataclass
class Phase:
    passed: int = 0
    failed: int = 0
    skips: list[str] = field(default_factory=list)  # "path::test: reason"


def node_id(case: ET.Element) -> str:
    """pytest's node id from an xunit1 testcase: file, classes below the module, name."""
    name, classname, path = case.get("name", "?"), case.get("classname", ""), case.get("file")
    if not path:
        return f"{classname}::{name}" if classname else name
    module = path.removesuffix(".py").replace("/", ".")
    classes = classname.removeprefix(module).strip(".")
    return "::".join(p for p in (path, *classes.split("."), name) if p)


def describe(case: ET.Element, skipped: ET.Element) -> str:
    reason = (skipped.get("message") or skipped.text or "no reason given").strip()
    if skipped.get("type") == "pytest.xfail":
        reason = f"expected to fail: {reason}"
    lines = reason.splitlines() or [""]
    if len(lines) > MAX_REASON_LINES:
        lines = [*lines[: MAX_REASON_LINES - 1], f"... ({len(lines)} lines, see the JUnit XML)"]
    return "\n      ".join([f"{node_id(case)}: {lines[0]}", *lines[1:]])


def read(xml: Path) -> Phase:
    root = ET.parse(xml).getroot()
    phase = Phase()
    for case in root.iter("testcase"):
        if not case.get("name"):  # the test a SIGINT interrupted: it did not finish
            continue
        skipped = case.find("skipped")
        if case.find("failure") is not None or case.find("error") is not None:
            phase.failed += 1
        elif skipped is not None:
            phase.skips.append(describe(case, skipped))
        else:
            phase.passed += 1
    return phase


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    name, xml, skips = argv
    try:
        phase = read(Path(xml))
    except (OSError, ET.ParseError):
        print(0, 1, 0)
        return 0
    with open(skips, "a", encoding="utf-8") as out:
        out.writelines(f"  [{name}] {s}\n" for s in phase.skips)
    print(phase.passed, phase.failed, len(phase.skips))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
