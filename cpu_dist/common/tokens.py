"""Job tokens: the shared secret every RPC to a PS shard carries.

Inside one ``mpirun`` job rank 0 makes a token and broadcasts it; shards started elsewhere
(``python -m cpu_dist.sparse.server``) and the jobs that use them read the same token from a
file (or ``$CPU_DIST_TOKEN``).  Both sides read the file through :func:`read_token_file`.
"""

from __future__ import annotations

import os
import stat

TOKEN_ENV = "CPU_DIST_TOKEN"


class TokenError(ValueError):
    """A token file that cannot be used; the message names the flag and the file."""


def read_token_file(path: str, flag: str = "--token-file") -> str:
    """The token in ``path``; refused when others could read it (a token readable by group
    or others lets any local user talk to the shards)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise TokenError(f"{flag} {path}: cannot read: {e.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise TokenError(
            f"{flag} {path} is readable by others (mode {stat.S_IMODE(mode):o}); make it "
            f"private with: chmod 600 {path}"
        )
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as e:
        raise TokenError(f"{flag} {path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise TokenError(f"{flag} {path}: not a UTF-8 text file") from None
    if not token:
        raise TokenError(f"{flag} {path} is empty")
    if not all(33 <= ord(c) <= 126 for c in token):
        raise TokenError(
            f"{flag} {path}: the token must be printable ASCII without spaces (it travels as "
            "gRPC call metadata)"
        )
    return token


def external_token(token_file: str | None) -> str | None:
    """The token of shards started elsewhere: the file's, else ``$CPU_DIST_TOKEN``."""
    if token_file:
        return read_token_file(token_file)
    return os.environ.get(TOKEN_ENV)


def write_token_file(path: str, token: str) -> None:
    """Create ``path`` holding ``token``, readable by its owner only (for tools and tests)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        os.fchmod(f.fileno(), 0o600)  # an existing file keeps its mode through O_TRUNC
        f.write(token + "\n")
