"""JaggedTensor, KeyedJaggedTensor and KeyedTensor: TorchRec's key-major layouts against
hand-computed small cases, and errors that name the key."""

from __future__ import annotations

import pytest
import torch

from cpu_dist.embeddings import JaggedTensor, KeyedJaggedTensor, KeyedTensor, as_keyed_jagged

pytestmark = pytest.mark.timeout(60)

T = torch.tensor


def sample() -> KeyedJaggedTensor:
    # sample 0: a=[3, 7], b=[1]; sample 1: a=[], b=[2, 2]; weights per id
    return KeyedJaggedTensor.from_lengths_sync(
        ["a", "b"], T([3, 7, 1, 2, 2]), T([2, 0, 1, 2]), weights=T([0.5, 1.0, 2.0, 3.0, 4.0])
    )


def test_key_major_layout_by_hand():
    kjt = sample()
    assert kjt.keys() == ["a", "b"] and kjt.stride() == 2
    assert kjt.offsets().tolist() == [0, 2, 2, 3, 5]
    assert kjt.length_per_key() == [2, 3] and kjt.offset_per_key() == [0, 2, 5]
    a, b = kjt["a"], kjt["b"]
    assert [x.tolist() for x in a.to_dense()] == [[3, 7], []]
    assert [x.tolist() for x in b.to_dense()] == [[1], [2, 2]]
    assert b.lengths().tolist() == [1, 2] and b.offsets().tolist() == [0, 1, 3]
    assert b.weights().tolist() == [2.0, 3.0, 4.0]
    assert list(kjt.to_dict()) == ["a", "b"]
    assert torch.equal(kjt.to_dict()["b"].values(), T([1, 2, 2]))


def test_offsets_and_lengths_build_the_same_tensor():
    by_offsets = KeyedJaggedTensor.from_offsets_sync(
        ["a", "b"], T([3, 7, 1, 2, 2]), T([0, 2, 2, 3, 5])
    )
    assert by_offsets.lengths().tolist() == [2, 0, 1, 2]
    assert by_offsets.weights_or_none() is None
    with pytest.raises(ValueError, match="no weights"):
        by_offsets.weights()
    with pytest.raises(ValueError, match="disagree"):
        KeyedJaggedTensor(["a"], T([1, 2]), lengths=T([1, 1]), offsets=T([0, 2, 2]))


def test_from_jt_dict_round_trips():
    kjt = sample()
    again = KeyedJaggedTensor.from_jt_dict(kjt.to_dict())
    assert torch.equal(again.values(), kjt.values()) and torch.equal(again.lengths(), kjt.lengths())
    assert torch.equal(again.weights(), kjt.weights())


def test_jagged_tensor_by_hand():
    jt = JaggedTensor(values=T([4, 5, 9]), lengths=T([2, 0, 1]))
    assert jt.offsets().tolist() == [0, 2, 2, 3]
    assert [x.tolist() for x in jt.to_dense()] == [[4, 5], [], [9]]
    dense = JaggedTensor.from_dense([T([1]), T([2, 3])], weights=[T([0.5]), T([1.0, 2.0])])
    assert dense.lengths().tolist() == [1, 2] and dense.weights().tolist() == [0.5, 1.0, 2.0]
    assert JaggedTensor(T([4, 5, 9]), offsets=T([0, 1, 3])).lengths().tolist() == [1, 2]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: KeyedJaggedTensor(["a", "b"], T([1, 2]), lengths=T([1, 1, 0])),
            r"3 bags do not split into 2 keys",
        ),
        (
            lambda: KeyedJaggedTensor(["a", "b"], T([1, 2]), lengths=T([1, 0, -1, 2])),
            r"key 'b' \(sample 0\) has length -1",
        ),
        (
            lambda: KeyedJaggedTensor(["a", "b"], T([1, 2]), lengths=T([1, 0, 0, 0])),
            r"the bags hold 1 ids, values has 2",
        ),
        (
            lambda: KeyedJaggedTensor(["a", "b"], T([1, 2]), offsets=T([0, 2, 1, 2, 2])),
            r"offsets decrease at key 'a' \(sample 1\)",
        ),
        (
            lambda: KeyedJaggedTensor(["a", "a"], T([1, 2]), lengths=T([1, 1])),
            r"keys 'a' appear twice",
        ),
        (
            lambda: KeyedJaggedTensor(["a"], T([1, 2]), T([1.0]), lengths=T([2])),
            r"weights has 1 entries, values has 2",
        ),
        (lambda: KeyedJaggedTensor(["a"], T([1, 2]), lengths=T([2]), stride=3), r"stride 3"),
        (
            lambda: KeyedJaggedTensor(["a"], T([1, 2]), lengths=T([1.0, 1.0])),
            r"lengths must be an integer",
        ),
        (lambda: KeyedJaggedTensor(["a"], T([1, 2])), r"give lengths or offsets"),
        (lambda: KeyedJaggedTensor([], T([1]), lengths=T([1])), r"1 bags but no keys"),
        (
            lambda: KeyedJaggedTensor(["a"], T([1]), offsets=T([], dtype=torch.int64)),
            r"offsets must start with 0",
        ),
    ],
)
def test_bad_layouts_are_refused_naming_the_problem(build, message):
    with pytest.raises((ValueError, TypeError), match=message):
        build()


def test_a_missing_key_is_named():
    with pytest.raises(
        KeyError, match=r"key 'c' is not in this KeyedJaggedTensor \(its keys: a, b\)"
    ):
        sample()["c"]


class StandIn:
    """TorchRec's KeyedJaggedTensor as far as duck typing goes (no torchrec installed)."""

    def __init__(self, keys, values, lengths, weights=None):
        self._k, self._v, self._l, self._w = keys, values, lengths, weights

    def keys(self):
        return self._k

    def values(self):
        return self._v

    def lengths(self):
        return self._l

    def weights_or_none(self):
        return self._w


def test_torchrecs_kjt_is_accepted_by_duck_typing():
    ours = sample()
    theirs = as_keyed_jagged(StandIn(["a", "b"], ours.values(), ours.lengths(), ours.weights()))
    assert theirs.keys() == ours.keys() and theirs.offsets().tolist() == ours.offsets().tolist()
    assert torch.equal(theirs.weights(), ours.weights())
    assert as_keyed_jagged(ours) is ours
    with pytest.raises(TypeError, match="expected a KeyedJaggedTensor"):
        as_keyed_jagged({"a": [1]})


def test_keyed_tensor_layout_by_hand():
    a = T([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    b = T([[7.0], [8.0]])
    kt = KeyedTensor.from_tensor_list(["a", "b"], [a, b])
    assert kt.values().tolist() == [[1.0, 2.0, 3.0, 7.0], [4.0, 5.0, 6.0, 8.0]]
    assert kt.keys() == ["a", "b"] and kt.length_per_key() == [3, 1]
    assert kt.offset_per_key() == [0, 3, 4] and kt.key_dim() == 1
    assert torch.equal(kt["b"], b) and torch.equal(kt.to_dict()["a"], a)
    with pytest.raises(KeyError, match=r"key 'c' is not in this KeyedTensor"):
        kt["c"]
    with pytest.raises(ValueError, match=r"values \(2, 4\): expected \[B, 5\]"):
        KeyedTensor(["a", "b"], [3, 2], kt.values())
