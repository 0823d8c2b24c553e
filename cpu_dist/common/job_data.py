"""The job file's ``[data]`` section: which data, and how its columns become features.

Keys (:data:`DATA_KEYS`; any other is refused):

- flags of their own (:data:`DATA_FLAG_KEYS`), made the parser's defaults as ``[job]``
  values are, so the command line still beats them: ``kind`` (``--data``), ``path``
  (``--data-path``), ``multi_hot_sizes`` (``--multi-hot-sizes``, an array or a string) and
  ``multi_hot_distribution`` (``--multi-hot-distribution``);
- ``bags = { FEATURE = [MIN, MAX] }`` (synthetic data): the feature is multi-hot, bag lengths
  uniform in ``MIN..MAX`` (``0 <= MIN <= MAX <= MAX_BAG_LENGTH``, ``MAX >= 1``);
- ``weights``: per-id weights; synthetic data: ``["FEATURE", ...]`` (drawn weights); Parquet:
  ``{ FEATURE = "COLUMN" }``, each a ``list<float>`` column as long as the feature's ids;
- Parquet's columns: ``label`` (default ``"label"``) and ``dense = ["COLUMN", ...]``
  (default: every float column but the label);
- synthetic data: ``dense = N`` (the dense width, default 13) and ``cardinalities = { FEATURE
  = N }`` (a feature of another name than ``cat_0 ... cat_25``: its ids' range; default its
  table's ``num_embeddings``, else 100,000).

Whether the features exist and the data kind can have them is checked with the flags
(``job_file_checks``), since ``--data`` may come from the command line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cpu_dist.common.config import MAX_BAG_LENGTH
from cpu_dist.common.job_values import JobFileError, toml_kind

# [data] keys that are flags: key -> flag dest.  Such a flag is refused in [job].
DATA_FLAG_KEYS = {
    "kind": "data",
    "path": "data_path",
    "multi_hot_sizes": "multi_hot_sizes",
    "multi_hot_distribution": "multi_hot_distribution",
}
DATA_KEYS = (*DATA_FLAG_KEYS, "bags", "weights", "label", "dense", "cardinalities")
MAX_DENSE = 4096  # [data] dense = N of synthetic data


@dataclass(frozen=True)
class DataSection:
    """A read ``[data]``: ``flags`` its flag keys as ``(dest, value)`` pairs (values as the
    file gives them: ``job_file.job_defaults`` checks them as the flags would);
    ``bags`` sorted ``(feature, min, max)``; ``weights`` the weighted features, sorted;
    ``weight_columns`` Parquet's ``(feature, column)`` pairs (empty for a list of weights);
    ``label`` and ``dense`` Parquet's columns (None: the defaults); ``dense_width`` and
    ``cardinalities`` (sorted ``(feature, N)``) synthetic data's ``dense = N`` and
    ``cardinalities``."""

    flags: tuple[tuple[str, object], ...] = ()
    bags: tuple[tuple[str, int, int], ...] = ()
    weights: tuple[str, ...] = ()
    weight_columns: tuple[tuple[str, str], ...] = ()
    label: str | None = None
    dense: tuple[str, ...] | None = None
    dense_width: int | None = None
    cardinalities: tuple[tuple[str, int], ...] = ()

    def flag(self, dest: str) -> object | None:
        return dict(self.flags).get(dest)


def read_data_section(path: str, data: Mapping[str, object]) -> DataSection:
    """``[data]``'s keys checked for shape (see the module docstring)."""
    for key in data:
        if key not in DATA_KEYS:
            raise JobFileError(
                f"{path}: [data] {key}: unknown key ([data]'s keys: {', '.join(DATA_KEYS)}; "
                "any other data flag goes in [job])"
            )
    flags = []
    for key, dest in DATA_FLAG_KEYS.items():
        if key not in data:
            continue
        value = data[key]
        if key == "multi_hot_sizes" and isinstance(value, list):
            if not value or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                raise JobFileError(
                    f"{path}: [data] multi_hot_sizes (--multi-hot-sizes): expected an array of "
                    "integers (one bag size per feature) or a string"
                )
            value = ",".join(str(v) for v in value)
        if not isinstance(value, str):
            raise JobFileError(
                f"{path}: [data] {key} (--{dest.replace('_', '-')}): expected a string, got "
                f"{toml_kind(value)}"
            )
        flags.append((dest, value))
    weights: tuple[str, ...] = ()
    columns: tuple[tuple[str, str], ...] = ()
    if "weights" in data:
        weights, columns = _weights(path, data["weights"])
    dense = data.get("dense")
    width = None
    if isinstance(dense, int) and not isinstance(dense, bool):
        if not 0 <= dense <= MAX_DENSE:
            raise JobFileError(f"{path}: [data] dense {dense}: must be in 0..{MAX_DENSE}")
        width, dense = dense, None
    return DataSection(
        flags=tuple(flags),
        bags=_bags(path, data["bags"]) if "bags" in data else (),
        weights=weights,
        weight_columns=columns,
        label=_column(path, "label", data["label"]) if "label" in data else None,
        dense=_columns(path, "dense", dense) if dense is not None else None,
        dense_width=width,
        cardinalities=(
            _cardinalities(path, data["cardinalities"]) if "cardinalities" in data else ()
        ),
    )


def _cardinalities(path: str, value: object) -> tuple[tuple[str, int], ...]:
    """``cardinalities = { FEATURE = N }`` as sorted (feature, N) pairs, N >= 1."""
    where = f"{path}: [data] cardinalities"
    if not isinstance(value, dict):
        raise JobFileError(
            f"{where}: expected a table of FEATURE = N (cardinalities = {{ user = 50000 }}), "
            f"got {toml_kind(value)}"
        )
    for feature, n in value.items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            shown = n if isinstance(n, int) and not isinstance(n, bool) else toml_kind(n)
            raise JobFileError(f"{where}: {feature!r}: {shown}: expected an integer >= 1")
    return tuple(sorted((str(f), int(n)) for f, n in value.items()))


def _column(path: str, key: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise JobFileError(
            f"{path}: [data] {key}: expected a column name (a string), got {toml_kind(value)}"
        )
    return value


def _columns(path: str, key: str, value: object) -> tuple[str, ...]:
    where = f"{path}: [data] {key}"
    if not isinstance(value, list) or not all(isinstance(c, str) and c for c in value):
        hint = " or, for synthetic data, a width (dense = 13)" if key == "dense" else ""
        raise JobFileError(
            f'{where}: expected an array of column names ({key} = ["x0", "x1"]){hint}'
        )
    twice = sorted({c for c in value if value.count(c) > 1})
    if twice:
        raise JobFileError(f"{where}: {', '.join(map(repr, twice))} listed twice")
    return tuple(value)


def _bags(path: str, value: object) -> tuple[tuple[str, int, int], ...]:
    """``bags = { FEATURE = [MIN, MAX] }`` as sorted (feature, min, max) triples."""
    where = f"{path}: [data] bags"
    if not isinstance(value, dict):
        raise JobFileError(
            f"{where}: expected a table of FEATURE = [MIN, MAX] (bags = {{ cat_0 = [1, 20] }}), "
            f"got {toml_kind(value)}"
        )
    out = []
    for feature in sorted(value):
        pair = value[feature]
        at = f"{where}: {feature!r}"
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair)
        ):
            if not isinstance(pair, list):
                shown = toml_kind(pair)
            elif len(pair) != 2:
                shown = f"{len(pair)} values"
            else:
                shown = " and ".join(toml_kind(v) for v in pair)
            raise JobFileError(f"{at}: expected [MIN, MAX], two integers, got {shown}")
        low, high = pair
        if not 0 <= low <= high <= MAX_BAG_LENGTH:
            raise JobFileError(
                f"{at}: [{low}, {high}]: bag lengths must satisfy 0 <= MIN <= MAX <= "
                f"{MAX_BAG_LENGTH}"
            )
        if high == 0:
            raise JobFileError(
                f"{at}: [0, 0]: every bag would be empty (MAX >= 1; MIN 0 allows empty bags)"
            )
        out.append((feature, int(low), int(high)))
    return tuple(out)


def _weights(path: str, value: object) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """``weights = ["FEATURE", ...]`` (synthetic) or ``{ FEATURE = "COLUMN" }`` (Parquet):
    the weighted features, sorted, and the columns (empty for the list)."""
    where = f"{path}: [data] weights"
    if isinstance(value, dict):
        bad = [f for f, c in value.items() if not isinstance(c, str) or not c]
        if bad:
            raise JobFileError(
                f"{where}: {bad[0]!r}: expected a column name (a string), got "
                f"{toml_kind(value[bad[0]])}"
            )
        pairs = tuple(sorted((str(f), str(c)) for f, c in value.items()))
        return tuple(f for f, _ in pairs), pairs
    if not isinstance(value, list) or not all(isinstance(f, str) for f in value):
        raise JobFileError(
            f'{where}: expected an array of feature names (weights = ["cat_0"]) or, for '
            'Parquet data, a table of FEATURE = "COLUMN"'
        )
    twice = sorted({f for f in value if value.count(f) > 1})
    if twice:
        raise JobFileError(f"{where}: {', '.join(map(repr, twice))} listed twice")
    return tuple(sorted(value)), ()
