"""The metrics log's reader: the header names the run and is no record, a header-less log
of an older version still reads, a torn last line is left out and a broken one is named."""

from __future__ import annotations

import json

import pytest

from cpu_dist.common.files import check_output_file, is_metrics_log
from cpu_dist.common.metrics_log import MetricsLogError, header, read_log, read_records


def _write(path, *records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_the_header_names_the_run_and_is_not_a_record(tmp_path):
    log = tmp_path / "m.jsonl"
    _write(log, header("abc"), {"step": 1, "loss": 0.5}, {"summary": {"steps": 1}})
    got = read_log(log)
    assert got.run == "abc"
    assert got.records == [{"step": 1, "loss": 0.5}, {"summary": {"steps": 1}}]
    assert read_records(log) == got.records
    assert [json.loads(x) for x in got.lines] == got.records  # the lines as written
    # a header-first log is a metrics log an output flag may replace
    check_output_file(log, "--metrics-out", "a metrics log", is_metrics_log)
    assert is_metrics_log(log)


def test_a_log_of_an_older_version_has_no_run(tmp_path):
    log = tmp_path / "m.jsonl"
    _write(log, {"step": 5, "loss": 0.5}, {"step": 10, "loss": 0.4})
    got = read_log(log)
    assert got.run is None and [r["step"] for r in got.records] == [5, 10]


def test_a_torn_last_line_is_left_out_and_a_broken_line_is_named(tmp_path):
    log = tmp_path / "m.jsonl"
    log.write_text(json.dumps(header("r")) + '\n{"step": 1}\n{"step": 2, "lo')
    assert read_records(log) == [{"step": 1}]  # being written, or torn by a crash
    log.write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
    with pytest.raises(MetricsLogError, match=rf"{log}:2: not JSON"):
        read_records(log)
    log.write_text('{"step": 1}\n[1, 2]\n')
    with pytest.raises(MetricsLogError, match=rf"{log}:2: not a JSON object"):
        read_records(log)
