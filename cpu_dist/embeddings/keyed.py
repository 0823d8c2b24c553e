"""``KeyedTensor``: pooled features side by side, TorchRec's output of an
``EmbeddingBagCollection``.

``values()`` is ``[B, sum of the keys' widths]``: feature ``keys()[i]`` is the column range
``offset_per_key()[i] : offset_per_key()[i + 1]``.  Keeping one dense tensor (rather than a
dict) lets a model concatenate or interact the features without copying them first.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["KeyedTensor"]


class KeyedTensor:
    """Named column blocks of one ``[B, D]`` tensor.

    Args:
        keys: the features' names, unique.
        length_per_key: each feature's width (its table's ``embedding_dim``).
        values: ``[B, sum(length_per_key)]``.
        key_dim: the dimension the keys split (1, TorchRec's default and the only one here).

    Example::

        kt = KeyedTensor.from_tensor_list(["a", "b"], [torch.ones(2, 3), torch.zeros(2, 1)])
        kt.values().shape    # torch.Size([2, 4])
        kt.offset_per_key()  # [0, 3, 4]
        kt["b"]              # tensor([[0.], [0.]])
    """

    def __init__(
        self,
        keys: Sequence[str],
        length_per_key: Sequence[int],
        values: torch.Tensor,
        key_dim: int = 1,
    ) -> None:
        if key_dim != 1:
            raise ValueError(f"KeyedTensor: key_dim {key_dim}: only 1 (features as columns)")
        self._keys = list(keys)
        self._lengths = [int(n) for n in length_per_key]
        if len(self._keys) != len(self._lengths):
            raise ValueError(
                f"KeyedTensor: {len(self._keys)} keys but {len(self._lengths)} lengths"
            )
        twice = sorted({k for k in self._keys if self._keys.count(k) > 1})
        if twice:
            raise ValueError(f"KeyedTensor: keys {', '.join(map(repr, twice))} appear twice")
        if values.dim() != 2 or values.shape[1] != sum(self._lengths):
            raise ValueError(
                f"KeyedTensor: values {tuple(values.shape)}: expected [B, {sum(self._lengths)}]"
            )
        self._values = values
        self._offsets = [0]
        for n in self._lengths:
            self._offsets.append(self._offsets[-1] + n)
        self._index = {k: i for i, k in enumerate(self._keys)}

    @staticmethod
    def from_tensor_list(keys: Sequence[str], tensors: Sequence[torch.Tensor]) -> KeyedTensor:
        """From one ``[B, d_i]`` tensor per key (concatenated along dim 1)."""
        return KeyedTensor(keys, [int(t.shape[1]) for t in tensors], torch.cat(list(tensors), 1))

    def keys(self) -> list[str]:
        return list(self._keys)

    def values(self) -> torch.Tensor:
        return self._values

    def key_dim(self) -> int:
        return 1

    def length_per_key(self) -> list[int]:
        return list(self._lengths)

    def offset_per_key(self) -> list[int]:
        """Each key's first column, plus the total width: ``[len(keys) + 1]``."""
        return list(self._offsets)

    def __getitem__(self, key: str) -> torch.Tensor:
        try:
            i = self._index[key]
        except KeyError:
            raise KeyError(
                f"key {key!r} is not in this KeyedTensor (its keys: {', '.join(self._keys)})"
            ) from None
        return self._values[:, self._offsets[i] : self._offsets[i + 1]]

    def to_dict(self) -> dict[str, torch.Tensor]:
        """``{feature: [B, d]}`` (views of ``values()``) in key order."""
        return {k: self[k] for k in self._keys}

    def __repr__(self) -> str:
        return f"KeyedTensor(keys={self._keys}, length_per_key={self._lengths})"
