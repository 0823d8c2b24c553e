"""``JaggedTensor`` and ``KeyedJaggedTensor``: variable-length id lists, TorchRec's layout.

A jagged tensor is a batch of bags (a user's last clicked items, an ad's keywords): ``values``
holds every bag's ids back to back and ``lengths`` (or ``offsets``, their exclusive running
sum with a trailing total) says where each bag ends.  A keyed jagged tensor holds several
features at once *key-major*, as TorchRec's does: all of feature 0's ``stride`` bags, then all
of feature 1's, ...; so ``lengths`` is ``[len(keys) * stride]`` and ``lengths[k * stride + b]``
is sample ``b``'s bag of feature ``k``.  Optional ``weights`` (one float per id) weight the
pooling.  Everything is checked when built, with errors that name the feature, so a bad batch
fails where it is made and not deep inside a pooling kernel.

:func:`as_keyed_jagged` accepts TorchRec's own ``KeyedJaggedTensor`` (or anything with its
``keys()``, ``values()``, ``lengths()``, ``weights_or_none()``) without importing torchrec.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

__all__ = ["JaggedTensor", "KeyedJaggedTensor", "as_keyed_jagged"]


def _offsets_of(lengths: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths.to(torch.int64), 0, out=out[1:])
    return out


def _tensor(value: object, what: str, where: str) -> torch.Tensor:
    t = torch.as_tensor(value)
    if t.dim() != 1:
        raise ValueError(f"{where}: {what} must be 1-D, got shape {tuple(t.shape)}")
    return t


def _check_ints(t: torch.Tensor, what: str, where: str) -> torch.Tensor:
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{where}: {what} must be an integer tensor, got {t.dtype}")
    return t


def _check_weights(weights: object, n: int, where: str) -> torch.Tensor | None:
    if weights is None:
        return None
    w = _tensor(weights, "weights", where)
    if not w.is_floating_point():
        raise TypeError(f"{where}: weights must be a float tensor, got {w.dtype}")
    if w.numel() != n:
        raise ValueError(f"{where}: weights has {w.numel()} entries, values has {n}")
    return w


def _bag_owner(keys: Sequence[str] | None, stride: int, bag: int) -> str:
    if keys is None or not stride:
        return f"bag {bag}"
    return f"key {keys[bag // stride]!r} (sample {bag % stride})"


def _lengths_and_offsets(
    values: torch.Tensor,
    lengths: object,
    offsets: object,
    where: str,
    keys: Sequence[str] | None = None,
    stride: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Checked ``(lengths, offsets)`` int64 from whichever is given (both: they must agree)."""
    if lengths is None and offsets is None:
        raise ValueError(f"{where}: give lengths or offsets")
    n = values.numel()
    if lengths is not None:
        ln = _check_ints(_tensor(lengths, "lengths", where), "lengths", where).to(torch.int64)
        negative = torch.nonzero(ln < 0)
        if negative.numel():
            bag = int(negative[0, 0])
            raise ValueError(
                f"{where}: lengths: {_bag_owner(keys, stride, bag)} has length {int(ln[bag])}"
            )
        off = _offsets_of(ln)
        if offsets is not None and not torch.equal(
            _tensor(offsets, "offsets", where).to(torch.int64), off
        ):
            raise ValueError(f"{where}: lengths and offsets disagree")
    else:
        off = _check_ints(_tensor(offsets, "offsets", where), "offsets", where).to(torch.int64)
        if off.numel() == 0 or int(off[0]) != 0:
            raise ValueError(f"{where}: offsets must start with 0 (they have a trailing total)")
        ln = off[1:] - off[:-1]
        falling = torch.nonzero(ln < 0)
        if falling.numel():
            bag = int(falling[0, 0])
            raise ValueError(f"{where}: offsets decrease at {_bag_owner(keys, stride, bag)}")
    total = int(off[-1])
    if total != n:
        raise ValueError(f"{where}: the bags hold {total} ids, values has {n}")
    return ln, off


class JaggedTensor:
    """One feature's bags: ``values`` back to back, cut by ``lengths`` or ``offsets``.

    Args:
        values: the ids (or any 1-D values) of every bag, in bag order.
        weights: optional per-value float weights, the shape of ``values``.
        lengths: each bag's length, ``[B]``.
        offsets: ``[B + 1]``, starting at 0, ending at ``len(values)``.

    Example::

        jt = JaggedTensor(values=torch.tensor([4, 5, 9]), lengths=torch.tensor([2, 0, 1]))
        jt.offsets()   # tensor([0, 2, 2, 3])
        jt.to_dense()  # [tensor([4, 5]), tensor([]), tensor([9])]
    """

    def __init__(
        self,
        values: torch.Tensor,
        weights: torch.Tensor | None = None,
        lengths: torch.Tensor | None = None,
        offsets: torch.Tensor | None = None,
        *,
        _where: str = "JaggedTensor",
    ) -> None:
        self._values = _tensor(values, "values", _where)
        self._weights = _check_weights(weights, self._values.numel(), _where)
        self._lengths, self._offsets = _lengths_and_offsets(self._values, lengths, offsets, _where)

    @classmethod
    def from_dense(
        cls, values: Sequence[torch.Tensor], weights: Sequence[torch.Tensor] | None = None
    ) -> JaggedTensor:
        """From a list of bags (each a 1-D tensor) and, optionally, their weights."""
        lengths = torch.tensor([int(v.numel()) for v in values], dtype=torch.int64)
        flat = (
            torch.cat([torch.as_tensor(v).reshape(-1) for v in values])
            if values
            else (torch.zeros(0, dtype=torch.int64))
        )
        w = torch.cat([torch.as_tensor(x).reshape(-1) for x in weights]) if weights else None
        return cls(flat, w, lengths=lengths)

    def values(self) -> torch.Tensor:
        return self._values

    def lengths(self) -> torch.Tensor:
        return self._lengths

    def offsets(self) -> torch.Tensor:
        return self._offsets

    def lengths_or_none(self) -> torch.Tensor | None:
        return self._lengths

    def offsets_or_none(self) -> torch.Tensor | None:
        return self._offsets

    def weights(self) -> torch.Tensor:
        """The weights; a ``ValueError`` if there are none (TorchRec's contract)."""
        if self._weights is None:
            raise ValueError("this JaggedTensor has no weights")
        return self._weights

    def weights_or_none(self) -> torch.Tensor | None:
        return self._weights

    def to_dense(self) -> list[torch.Tensor]:
        """The bags as a list of 1-D tensors."""
        return list(torch.split(self._values, self._lengths.tolist()))

    def to_dense_weights(self) -> list[torch.Tensor] | None:
        if self._weights is None:
            return None
        return list(torch.split(self._weights, self._lengths.tolist()))

    def __repr__(self) -> str:
        w = "" if self._weights is None else f", weights={self._weights.tolist()}"
        return f"JaggedTensor({self.to_dense()}{w})"


class KeyedJaggedTensor:
    """Several features' bags for one batch, key-major (TorchRec's layout).

    Args:
        keys: the features' names, unique.
        values: every id: all of ``keys[0]``'s bags, then all of ``keys[1]``'s, ...
        weights: optional per-id float weights, the shape of ``values``.
        lengths: ``[len(keys) * stride]``; ``lengths[k * stride + b]`` is sample ``b``'s bag
            of feature ``keys[k]``.
        offsets: ``[len(keys) * stride + 1]``, the running sum of ``lengths`` from 0.
        stride: the batch size; by default ``len(lengths) // len(keys)``.

    Example::

        # sample 0: clicked=[3, 7], query=[1]; sample 1: clicked=[], query=[2, 2]
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=["clicked", "query"],
            values=torch.tensor([3, 7, 1, 2, 2]),
            lengths=torch.tensor([2, 0, 1, 2]),
        )
        kjt.stride()           # 2
        kjt.length_per_key()   # [2, 3]
        kjt["query"].to_dense()  # [tensor([1]), tensor([2, 2])]
    """

    def __init__(
        self,
        keys: Sequence[str],
        values: torch.Tensor,
        weights: torch.Tensor | None = None,
        lengths: torch.Tensor | None = None,
        offsets: torch.Tensor | None = None,
        stride: int | None = None,
    ) -> None:
        where = "KeyedJaggedTensor"
        if isinstance(keys, str) or not all(isinstance(k, str) for k in keys):
            raise TypeError(f"{where}: keys must be a list of feature names, got {keys!r}")
        self._keys = list(keys)
        twice = sorted({k for k in self._keys if self._keys.count(k) > 1})
        if twice:
            raise ValueError(f"{where}: keys {', '.join(map(repr, twice))} appear twice")
        self._values = _tensor(values, "values", where)
        self._weights = _check_weights(weights, self._values.numel(), where)
        given = lengths if lengths is not None else offsets
        bags = 0 if given is None else _tensor(given, "lengths", where).numel()
        if lengths is None and given is not None:
            if bags == 0:
                raise ValueError(f"{where}: offsets must start with 0 (they have a trailing total)")
            bags -= 1
        k = len(self._keys)
        if k == 0:
            if bags:
                raise ValueError(f"{where}: {bags} bags but no keys")
            self._stride = int(stride or 0)
        elif bags % k:
            raise ValueError(
                f"{where}: {bags} bags do not split into {k} keys: lengths must be "
                "[len(keys) * stride], key-major"
            )
        else:
            self._stride = bags // k
            if stride is not None and int(stride) != self._stride:
                raise ValueError(
                    f"{where}: stride {stride}, but {bags} bags over {k} keys make {self._stride}"
                )
        if given is None:
            if k:
                raise ValueError(f"{where}: give lengths or offsets")
            lengths = torch.zeros(0, dtype=torch.int64)
        self._lengths, self._offsets = _lengths_and_offsets(
            self._values, lengths, offsets, where, self._keys, self._stride
        )
        per_key = self._lengths.reshape(k, self._stride).sum(1) if k else self._lengths[:0]
        self._length_per_key: list[int] = [int(x) for x in per_key.tolist()]
        self._offset_per_key: list[int] = [0]
        for n in self._length_per_key:
            self._offset_per_key.append(self._offset_per_key[-1] + n)
        self._index = {key: i for i, key in enumerate(self._keys)}
        # Which of lengths and offsets a caller has seen (given, or asked for): both are kept,
        # but lengths_or_none() / offsets_or_none() answer as TorchRec's lazy KJT does.
        self._lengths_known = lengths is not None or not k
        self._offsets_known = offsets is not None or not k

    def _with(
        self,
        values: torch.Tensor,
        weights: torch.Tensor | None,
        lengths: torch.Tensor,
        offsets: torch.Tensor,
    ) -> KeyedJaggedTensor:
        """This KJT's keys and layout over other tensors of the same contents (moved, pinned):
        nothing to check again."""
        out = object.__new__(KeyedJaggedTensor)
        out.__dict__.update(self.__dict__)
        out._values, out._weights, out._lengths, out._offsets = values, weights, lengths, offsets
        return out

    def to(
        self,
        device: torch.device | str,
        non_blocking: bool = False,
        dtype: torch.dtype | None = None,
    ) -> KeyedJaggedTensor:
        """A copy on ``device`` (TorchRec's ``to``): ``dtype``, when given, applies to the
        weights only; ids, lengths and offsets keep theirs."""
        w = self._weights
        return self._with(
            self._values.to(device, non_blocking=non_blocking),
            None if w is None else w.to(device=device, dtype=dtype, non_blocking=non_blocking),
            self._lengths.to(device, non_blocking=non_blocking),
            self._offsets.to(device, non_blocking=non_blocking),
        )

    def pin_memory(self) -> KeyedJaggedTensor:
        """A copy in page-locked host memory, for a later ``to(device, non_blocking=True)``
        (needs an accelerator, as torch's ``Tensor.pin_memory`` does)."""
        w = self._weights
        return self._with(
            self._values.pin_memory(),
            None if w is None else w.pin_memory(),
            self._lengths.pin_memory(),
            self._offsets.pin_memory(),
        )

    def sync(self) -> KeyedJaggedTensor:
        """TorchRec computes ``length_per_key`` and ``offset_per_key`` here; ours are computed
        when built, so this returns the same KJT (for code written against TorchRec's)."""
        return self

    def lengths_or_none(self) -> torch.Tensor | None:
        """The lengths if given or asked for (``lengths()``), else None, as TorchRec's."""
        return self._lengths if self._lengths_known else None

    def offsets_or_none(self) -> torch.Tensor | None:
        """The offsets if given or asked for (``offsets()``), else None, as TorchRec's."""
        return self._offsets if self._offsets_known else None

    def split(self, segments: Sequence[int]) -> list[KeyedJaggedTensor]:
        """Consecutive groups of keys, ``segments[i]`` keys each (TorchRec's ``split``): a
        segment of every key is this KJT itself, a segment of 0 an empty KJT of the same
        stride; keys left after the last segment are in none."""
        if any(int(n) < 0 for n in segments) or sum(segments) > len(self._keys):
            raise ValueError(
                f"KeyedJaggedTensor.split: segments {list(segments)} must be >= 0 and sum to at "
                f"most the {len(self._keys)} keys"
            )
        out: list[KeyedJaggedTensor] = []
        start, s = 0, self._stride
        for n in segments:
            end = start + int(n)
            if n == len(self._keys):
                out.append(self)
            else:
                lo, hi = self._offset_per_key[start], self._offset_per_key[end]
                w = self._weights
                out.append(
                    KeyedJaggedTensor(
                        self._keys[start:end],
                        self._values[lo:hi],
                        None if w is None else w[lo:hi],
                        lengths=self._lengths[start * s : end * s],
                        stride=s,
                    )
                )
            start = end
        return out

    def permute(
        self, indices: Sequence[int], indices_tensor: torch.Tensor | None = None
    ) -> KeyedJaggedTensor:
        """The keys in the order ``indices`` names them, each with its bags and weights
        (TorchRec's ``permute``; ``indices_tensor`` is accepted and unused).  A subset is
        allowed; a key named twice is refused, since our keys are unique."""
        del indices_tensor
        k, s = len(self._keys), self._stride
        for i in indices:
            if not 0 <= int(i) < k:
                raise IndexError(f"KeyedJaggedTensor.permute: index {i} is not in 0..{k - 1}")
        spans = [(self._offset_per_key[i], self._offset_per_key[i + 1]) for i in indices]
        w = self._weights

        def gather(t: torch.Tensor) -> torch.Tensor:
            return torch.cat([t[lo:hi] for lo, hi in spans]) if spans else t[:0]

        lengths = [self._lengths[i * s : (i + 1) * s] for i in indices]
        return KeyedJaggedTensor(
            [self._keys[i] for i in indices],
            gather(self._values),
            None if w is None else gather(w),
            lengths=torch.cat(lengths) if lengths else self._lengths[:0],
            stride=s,
        )

    @staticmethod
    def from_lengths_sync(
        keys: Sequence[str],
        values: torch.Tensor,
        lengths: torch.Tensor,
        weights: torch.Tensor | None = None,
        stride: int | None = None,
    ) -> KeyedJaggedTensor:
        """From ids and bag lengths (TorchRec's constructor of that name)."""
        return KeyedJaggedTensor(keys, values, weights, lengths=lengths, stride=stride)

    @staticmethod
    def from_offsets_sync(
        keys: Sequence[str],
        values: torch.Tensor,
        offsets: torch.Tensor,
        weights: torch.Tensor | None = None,
        stride: int | None = None,
    ) -> KeyedJaggedTensor:
        """From ids and bag offsets ``[len(keys) * stride + 1]``."""
        return KeyedJaggedTensor(keys, values, weights, offsets=offsets, stride=stride)

    @staticmethod
    def from_jt_dict(jt_dict: Mapping[str, JaggedTensor]) -> KeyedJaggedTensor:
        """From ``{feature: JaggedTensor}`` of one batch size (all weighted or none)."""
        keys = list(jt_dict)
        jts = [jt_dict[k] for k in keys]
        strides = {k: int(jt.lengths().numel()) for k, jt in zip(keys, jts)}
        if len(set(strides.values())) > 1:
            raise ValueError(f"KeyedJaggedTensor.from_jt_dict: batch sizes differ: {strides}")
        weighted = [jt.weights_or_none() is not None for jt in jts]
        if any(weighted) and not all(weighted):
            bare = [k for k, w in zip(keys, weighted) if not w]
            raise ValueError(f"KeyedJaggedTensor.from_jt_dict: key {bare[0]!r} has no weights")
        cat = torch.cat
        return KeyedJaggedTensor(
            keys,
            cat([jt.values() for jt in jts]) if jts else torch.zeros(0, dtype=torch.int64),
            cat([jt.weights() for jt in jts]) if jts and all(weighted) else None,
            lengths=cat([jt.lengths() for jt in jts]) if jts else None,
            stride=next(iter(strides.values())) if jts else 0,
        )

    def keys(self) -> list[str]:
        return list(self._keys)

    def values(self) -> torch.Tensor:
        return self._values

    def lengths(self) -> torch.Tensor:
        self._lengths_known = True
        return self._lengths

    def offsets(self) -> torch.Tensor:
        self._offsets_known = True
        return self._offsets

    def weights(self) -> torch.Tensor:
        """The weights; a ``ValueError`` if there are none (TorchRec's contract)."""
        if self._weights is None:
            raise ValueError("this KeyedJaggedTensor has no weights")
        return self._weights

    def weights_or_none(self) -> torch.Tensor | None:
        return self._weights

    def stride(self) -> int:
        """The batch size: each key's number of bags."""
        return self._stride

    def length_per_key(self) -> list[int]:
        """How many ids each key holds, in key order."""
        return list(self._length_per_key)

    def offset_per_key(self) -> list[int]:
        """Where each key's ids start in ``values()``, plus the total: ``[len(keys) + 1]``."""
        return list(self._offset_per_key)

    def __getitem__(self, key: str) -> JaggedTensor:
        """One feature's bags."""
        try:
            k = self._index[key]
        except KeyError:
            raise KeyError(
                f"key {key!r} is not in this KeyedJaggedTensor (its keys: "
                f"{', '.join(self._keys) or 'none'})"
            ) from None
        lo, hi = self._offset_per_key[k], self._offset_per_key[k + 1]
        s = self._stride
        w = None if self._weights is None else self._weights[lo:hi]
        return JaggedTensor(
            self._values[lo:hi], w, lengths=self._lengths[k * s : (k + 1) * s], _where=repr(key)
        )

    def to_dict(self) -> dict[str, JaggedTensor]:
        """``{feature: JaggedTensor}`` in key order."""
        return {k: self[k] for k in self._keys}

    def __repr__(self) -> str:
        return "KeyedJaggedTensor({" + ", ".join(f"{k!r}: {self[k]!r}" for k in self._keys) + "})"


def as_keyed_jagged(features: object) -> KeyedJaggedTensor:
    """``features`` as our :class:`KeyedJaggedTensor`: ours as it is; TorchRec's (or any
    object with ``keys()``, ``values()``, ``lengths()`` and optionally ``weights_or_none()``)
    rebuilt from those, so that a TorchRec batch runs here without torchrec being a
    dependency."""
    if isinstance(features, KeyedJaggedTensor):
        return features
    needed = ("keys", "values", "lengths")
    if not all(callable(getattr(features, m, None)) for m in needed):
        raise TypeError(
            f"expected a KeyedJaggedTensor (keys(), values(), lengths()), got "
            f"{type(features).__name__}"
        )
    weights_of = getattr(features, "weights_or_none", None)
    weights = weights_of() if callable(weights_of) else None
    f = features
    return KeyedJaggedTensor(
        list(f.keys()),  # type: ignore[attr-defined]
        f.values(),  # type: ignore[attr-defined]
        weights,
        lengths=f.lengths(),  # type: ignore[attr-defined]
    )
