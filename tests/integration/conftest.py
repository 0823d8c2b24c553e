"""Fixtures the integration tests share."""

from __future__ import annotations

import pytest

from cpu_dist.common.tokens import write_token_file


@pytest.fixture
def token(tmp_path) -> str:
    """A private token file (mode 0600), as standalone shards and the jobs on them read it."""
    path = str(tmp_path / "token")
    write_token_file(path, f"integration-{tmp_path.name}")
    return path
