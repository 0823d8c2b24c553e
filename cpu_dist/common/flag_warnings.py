"""Warnings, not errors: flags the command line gave that change nothing in the chosen mode,
so that a user learns the setting was not applied (rank 0 prints them, ``validate``)."""

from __future__ import annotations

import argparse

from cpu_dist.common import modes
from cpu_dist.common.config import JobConfig
from cpu_dist.common.job_file_checks import job_file_of, table_defaults_unused


def ineffective_flags(a: argparse.Namespace, job: JobConfig) -> list[str]:
    """Flags the command line gave (``a.given``, from ``flags.parse_args``) that change nothing
    in the chosen mode: a warning each, so that a user learns the setting was not applied."""
    given: frozenset[str] = getattr(a, "given", frozenset())
    external = job.external_shards
    rules = [
        ("zipf_exponent", a.data != "synthetic", "--zipf-exponent", "--data synthetic"),
        (
            "checkpoint_keep",
            not a.checkpoint_dir,
            "--checkpoint-keep",
            "--checkpoint-dir",
        ),
        ("checkpoint_timeout", not a.checkpoint_dir, "--checkpoint-timeout", "--checkpoint-dir"),
        ("reuse_shard_rows", not external, "--reuse-shard-rows", "external --ps_list shards"),
        ("token_file", not external, "--token-file", "external --ps_list shards"),
        ("ps_host", external, "--ps-host", "PS ranks in the job"),
        ("ps_interface", external, "--ps-interface", "PS ranks in the job"),
        ("session_idle_timeout", external, "--session-idle-timeout", "PS ranks in the job"),
        ("worker_nice", external, "--worker-nice", "PS ranks in the job"),
        ("ps_memory_rows", external, "--ps-memory-rows", "PS ranks in the job"),
        ("ps_memory_bytes", external, "--ps-memory-bytes", "PS ranks in the job"),
        ("ps_ssd_dir", external, "--ps-ssd-dir", "PS ranks in the job"),
        ("dcn_num_layers", a.model != "dcnv2", "--dcn-num-layers", "--model dcnv2"),
        ("dcn_low_rank_dim", a.model != "dcnv2", "--dcn-low-rank-dim", "--model dcnv2"),
        ("lr_decay_start", a.lr_decay_steps == 0, "--lr-decay-start", "--lr-decay-steps"),
        ("lr_decay_power", a.lr_decay_steps == 0, "--lr-decay-power", "--lr-decay-steps"),
        ("lr_min", a.lr_decay_steps == 0, "--lr-min", "--lr-decay-steps"),
        (
            "optimization_plan_window",
            not a.optimization_prescan,
            "--optimization-plan-window",
            "--optimization-prescan",
        ),
    ]
    facts = modes.facts_of_flags(a, job.worker_num, external)
    out = modes.ineffective(given, facts)  # the flags the table of modes ties to a mode
    out += [
        f"{flag} has no effect without {needs}"
        for dest, unused, flag, needs in rules
        if dest in given and unused
    ]
    return out + _table_keys_unused(a, facts) + table_defaults_unused(a, given)


def _table_keys_unused(a: argparse.Namespace, facts: modes.Facts) -> list[str]:
    """Job-file table keys that change nothing in the chosen mode (``modes.MODE_TABLE_KEYS``)."""
    job_file = job_file_of(a)
    if job_file is None:
        return []
    out = []
    for key, fact, values, needs in modes.MODE_TABLE_KEYS:
        if getattr(facts, fact) in values:
            continue
        for entry in job_file.tables:
            if key in entry:
                out.append(
                    f'{job_file.path}: [[tables]] "{entry.get("name")}": {key} has no effect '
                    f"without {needs}"
                )
    return out
