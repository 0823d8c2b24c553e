"""The end of a command's process, once its work is done and what it opened is closed."""

from __future__ import annotations

import gc


def skip_exit_collection() -> None:
    """Leave the remaining objects out of the interpreter's teardown collection.

    Why: after ``torch.optim``'s first optimizer (which imports torch's compiler stack) a
    process holds ~300k objects, and the cyclic collector's walk over them at exit took about
    1 s on a 2-core node: a second added to every job rank and every reference or export run.
    Frozen objects are not walked; their memory goes back with the process.  Call it only
    after the command has closed what it opened: objects in reference cycles that are still
    alive then are not finalized."""
    gc.freeze()
