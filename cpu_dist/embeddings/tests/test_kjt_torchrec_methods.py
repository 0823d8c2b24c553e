"""The KeyedJaggedTensor methods TorchRec code calls (``to``, ``permute``, ``split``,
``pin_memory``, ``sync``, ``lengths_or_none``, ``offsets_or_none``, ``stride``,
``length_per_key``): against values worked out by hand, and against TorchRec's own KJT where
torchrec is installed (it is not in the test environment: those tests skip there)."""

from __future__ import annotations

import pytest
import torch

from cpu_dist.embeddings import KeyedJaggedTensor

pytestmark = pytest.mark.timeout(30)

# samples 0, 1 of three features, key-major:
#   a: [1, 2] / [3]      b: [] / [4, 5, 6]      c: [7] / [8]
KEYS = ["a", "b", "c"]
VALUES = [1, 2, 3, 4, 5, 6, 7, 8]
LENGTHS = [2, 1, 0, 3, 1, 1]
WEIGHTS = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]


def ours(weighted: bool = True) -> KeyedJaggedTensor:
    return KeyedJaggedTensor.from_lengths_sync(
        KEYS,
        torch.tensor(VALUES),
        torch.tensor(LENGTHS),
        weights=torch.tensor(WEIGHTS) if weighted else None,
    )


def as_lists(kjt) -> tuple:
    w = kjt.weights_or_none()
    return (
        list(kjt.keys()),
        kjt.values().tolist(),
        kjt.lengths().tolist(),
        None if w is None else w.tolist(),
        kjt.stride(),
        list(kjt.length_per_key()),
    )


def test_permute_by_hand():
    p = ours().permute([2, 0])
    assert as_lists(p) == (
        ["c", "a"],
        [7, 8, 1, 2, 3],
        [1, 1, 2, 1],
        [3.5, 4.0, 0.5, 1.0, 1.5],
        2,
        [2, 3],
    )
    assert p.offsets_or_none() is None and p.lengths_or_none() is not None  # as TorchRec's
    assert p["a"].to_dense()[0].tolist() == [1, 2]
    with pytest.raises(IndexError, match=r"index 3 is not in 0\.\.2"):
        ours().permute([3])
    with pytest.raises(ValueError, match="'a' appear twice"):
        ours().permute([0, 0])


def test_split_by_hand():
    kjt = ours()
    first, rest, empty = kjt.split([1, 2, 0])
    assert as_lists(first) == (["a"], [1, 2, 3], [2, 1], [0.5, 1.0, 1.5], 2, [3])
    assert as_lists(rest) == (
        ["b", "c"],
        [4, 5, 6, 7, 8],
        [0, 3, 1, 1],
        [2.0, 2.5, 3.0, 3.5, 4.0],
        2,
        [3, 2],
    )
    assert as_lists(empty) == ([], [], [], [], 2, [])
    assert kjt.split([3]) == [kjt]  # every key: the KJT itself, as TorchRec's
    with pytest.raises(ValueError, match=r"segments \[2, 2\] must be >= 0 and sum to at most"):
        kjt.split([2, 2])


def test_to_sync_and_lazy_lengths_or_offsets():
    kjt = ours()
    assert kjt.sync() is kjt and kjt.stride() == 2 and kjt.length_per_key() == [3, 3, 2]
    assert kjt.offsets_or_none() is None  # built from lengths: offsets not yet asked for
    assert kjt.offsets().tolist() == [0, 2, 3, 3, 6, 7, 8]
    assert kjt.offsets_or_none().tolist() == [0, 2, 3, 3, 6, 7, 8]
    by_offsets = KeyedJaggedTensor.from_offsets_sync(KEYS, torch.tensor(VALUES), kjt.offsets())
    assert by_offsets.lengths_or_none() is None and by_offsets.offsets_or_none() is not None
    moved = kjt.to(torch.device("cpu"), dtype=torch.float64)
    assert moved is not kjt and as_lists(moved)[:3] == as_lists(kjt)[:3]
    assert moved.weights().dtype == torch.float64 and moved.values().dtype == kjt.values().dtype
    assert ours(weighted=False).to("cpu").weights_or_none() is None


def test_pin_memory_pins_every_tensor(monkeypatch):
    """Pinning needs an accelerator; here each tensor's pin_memory is recorded instead."""
    pinned = []

    def pin(t: torch.Tensor) -> torch.Tensor:
        pinned.append(t.data_ptr())
        return t.clone()

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    kjt = ours()
    out = kjt.pin_memory()
    assert sorted(pinned) == sorted(
        t.data_ptr() for t in (kjt.values(), kjt.weights(), kjt.lengths(), kjt.offsets())
    )
    assert as_lists(out) == as_lists(kjt) and out.values().data_ptr() != kjt.values().data_ptr()


# ---- the same calls on TorchRec's own KJT (where torchrec is installed) ------------------


def theirs():
    jagged = pytest.importorskip("torchrec.sparse.jagged_tensor")
    return jagged.KeyedJaggedTensor.from_lengths_sync(
        KEYS, torch.tensor(VALUES), torch.tensor(LENGTHS), weights=torch.tensor(WEIGHTS)
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda k: [k.permute([2, 0])],
        lambda k: [k.permute([1])],
        lambda k: k.split([1, 2]),
        lambda k: k.split([2, 1]),
        lambda k: [k.to("cpu", dtype=torch.float64)],
        lambda k: [k.sync()],
    ],
)
def test_the_same_call_on_torchrecs_kjt(call):
    want = [as_lists(k) for k in call(theirs())]
    assert [as_lists(k) for k in call(ours())] == want


def test_lazy_lengths_and_offsets_as_torchrecs():
    t, o = theirs(), ours()
    assert (t.offsets_or_none() is None) == (o.offsets_or_none() is None)
    assert (t.permute([1, 0]).offsets_or_none() is None) == (
        o.permute([1, 0]).offsets_or_none() is None
    )
