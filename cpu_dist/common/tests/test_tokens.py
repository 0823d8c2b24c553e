"""Token files: read, stripped; refused when empty, missing or readable by others."""

import os

import pytest

from cpu_dist.common.tokens import TokenError, external_token, read_token_file

pytestmark = pytest.mark.timeout(30)


def write(path, text, mode):
    path.write_text(text)
    os.chmod(path, mode)
    return str(path)


def test_a_private_token_file_is_read_and_stripped(tmp_path):
    assert read_token_file(write(tmp_path / "t", "s3cret\n", 0o600)) == "s3cret"
    assert read_token_file(write(tmp_path / "r", "x", 0o400)) == "x"


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_token_others_can_read_is_refused_with_the_fix(tmp_path, mode):
    path = write(tmp_path / "t", "s3cret", mode)
    with pytest.raises(TokenError, match=f"readable by others .*chmod 600 {path}"):
        read_token_file(path)


def test_empty_and_missing_files_name_the_flag(tmp_path):
    with pytest.raises(TokenError, match=r"--token-file .* is empty"):
        read_token_file(write(tmp_path / "t", "  \n", 0o600))
    with pytest.raises(TokenError, match=r"--token-file .*nope: cannot read"):
        read_token_file(str(tmp_path / "nope"))


def test_the_environment_is_the_fallback(tmp_path, monkeypatch):
    monkeypatch.setenv("CPU_DIST_TOKEN", "from-env")
    assert external_token(None) == "from-env"
    assert external_token(write(tmp_path / "t", "from-file", 0o600)) == "from-file"


def test_a_token_that_cannot_travel_as_metadata_is_refused(tmp_path):
    with pytest.raises(TokenError, match="printable ASCII without spaces"):
        read_token_file(write(tmp_path / "t", "two words", 0o600))
