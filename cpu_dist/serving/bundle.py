"""The export bundle: a trained model that a plain Python process can score with, without MPI,
a parameter server or the native module.

    DIR/manifest.json   written last: format, version, the model settings (dims, MLP widths,
                        dtype, numbers of dense and sparse features), seed and init scale (so a
                        key the table never held scores with its first-touch row), the data
                        settings that made its keys (kind, --max-ind-range,
                        --num-embeddings-per-feature, --zipf-exponent) and the job's batch
                        size, the steps done (``steps``; version 1 wrote the last step,
                        ``step``), row count, and every file's size and crc32
    DIR/dense.pt        the dense parameters, a torch state dict (``bot.*``, ``top.*``)
    DIR/keys.npy        int64 [n], sorted ascending, memory-mappable
    DIR/rows.npy        float32 [n, dim], row i belongs to keys[i]

The writer (``cpu_dist.export``) and the reader (``cpu_dist.serving``) share this module.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cpu_dist.common.files import (
    EXPORT_FORMAT,
    atomic_write,
    check_output_dir,
    file_crc32,
    is_export_bundle,
    replace_dir,
    temp_sibling,
)

# Version 2 adds "data"; version 1 bundles (no data settings) are still read.
FORMAT, VERSION = EXPORT_FORMAT, 2
READABLE_VERSIONS = (1, 2)
MANIFEST, DENSE, KEYS, ROWS = "manifest.json", "dense.pt", "keys.npy", "rows.npy"


class BundleError(RuntimeError):
    """A bundle that cannot be used; the message names the file and the problem."""


@dataclass(frozen=True)
class ModelSpec:
    """What it takes to rebuild the model around the rows."""

    dim: int
    num_dense: int
    num_sparse: int
    bot_mlp: tuple[int, ...]
    top_mlp: tuple[int, ...]
    dtype: str
    seed: int
    init_scale: float
    table: str


@dataclass(frozen=True)
class DataSpec:
    """The data settings that made the bundle's keys, and the job's global batch size (what
    its evaluation batches were cut by); serving applies them and refuses other kinds."""

    kind: str  # --data: "synthetic", or a Criteo file ("criteo" TSV, "criteo-bin" converted)
    max_ind_range: int | None
    num_embeddings_per_feature: tuple[int, ...] | None
    zipf_exponent: float
    batch_size: int

    @property
    def family(self) -> str:
        """A TSV file and its conversion give the same batches: one kind of data."""
        return "synthetic" if self.kind == "synthetic" else "criteo"


def spec_from_dense_state(state: dict[str, torch.Tensor], **settings: Any) -> ModelSpec:
    """The feature counts follow from the dense weights: the bottom MLP's input width is the
    number of dense features, and the top MLP's input is dim + F(F+1)/2 for F sparse ones."""
    dim = int(settings["dim"])
    num_dense = int(state["bot.0.weight"].shape[1])
    pairs = int(state["top.0.weight"].shape[1]) - dim
    num_sparse = int((-1 + (1 + 8 * pairs) ** 0.5) / 2)
    if num_sparse * (num_sparse + 1) // 2 != pairs:
        raise BundleError(f"top MLP input {pairs + dim} does not fit dim {dim}")
    return ModelSpec(
        dim=dim,
        num_dense=num_dense,
        num_sparse=num_sparse,
        **{k: v for k, v in settings.items() if k != "dim"},
    )


def check_bundle_output(out: str | os.PathLike, flag: str) -> None:
    """``out`` may receive a bundle: it is missing, empty, or an earlier bundle (nothing else
    in it), else BundleError naming ``flag``; replacing another kind of directory (converted
    data, a checkpoint) would destroy it."""
    try:
        check_output_dir(out, flag, "an export bundle", is_export_bundle)
    except ValueError as exc:
        raise BundleError(str(exc)) from None


class BundleWriter:
    """Rows arrive in any order (pages of a dump); ``finish`` sorts them by key into
    ``rows.npy`` through a memory map, so memory stays at 16 bytes per row (keys, order).

    Everything is written into a hidden directory beside ``out`` and renamed into place at the
    end, so ``out`` is never half a bundle; an ``out`` that is not empty or an earlier bundle
    is refused before anything is written (and again before the rename)."""

    def __init__(self, out: Path, dim: int, rows: int, flag: str = "export") -> None:
        out = Path(os.path.abspath(out))
        check_bundle_output(out, flag)
        self.final, self.dim, self.total = out, dim, rows
        self.out = temp_sibling(out)
        self._keys = np.empty(rows, dtype=np.int64)
        self._scratch = np.lib.format.open_memmap(
            self.out / ".rows.unsorted.npy", mode="w+", dtype=np.float32, shape=(rows, dim)
        )
        self.filled = 0

    def abort(self) -> None:
        """Removes the unfinished bundle (``out`` is left as it was)."""
        import shutil

        shutil.rmtree(self.out, ignore_errors=True)

    def add(self, keys: np.ndarray, values: np.ndarray) -> None:
        n = len(keys)
        if self.filled + n > self.total:
            raise BundleError(f"more rows than the {self.total} announced")
        self._keys[self.filled : self.filled + n] = keys
        self._scratch[self.filled : self.filled + n] = values
        self.filled += n

    def finish(
        self,
        spec: ModelSpec,
        dense: dict[str, torch.Tensor],
        steps: int,
        data: DataSpec | None = None,
    ) -> None:
        """``steps``: the steps the model has trained (``checkpoint.steps_done``), the number
        checkpoints are named by too."""
        if self.filled != self.total:
            raise BundleError(f"{self.filled} rows written, {self.total} announced")
        order = np.argsort(self._keys, kind="stable")
        keys = self._keys[order]
        if len(keys) > 1 and not (keys[1:] > keys[:-1]).all():
            raise BundleError("a key appears twice in the exported rows")
        np.save(self.out / KEYS, keys)
        rows = np.lib.format.open_memmap(
            self.out / ROWS, mode="w+", dtype=np.float32, shape=(self.total, self.dim)
        )
        for start in range(0, self.total, 1 << 18):  # gathered in blocks: bounded memory
            block = order[start : start + (1 << 18)]
            rows[start : start + len(block)] = self._scratch[block]
        rows.flush()
        del rows
        os.unlink(self.out / ".rows.unsorted.npy")
        buf = io.BytesIO()
        torch.save(dense, buf)
        atomic_write(self.out / DENSE, lambda f: f.write(buf.getbuffer()))
        files = {}
        for name in (DENSE, KEYS, ROWS):
            size, crc = file_crc32(self.out / name)
            files[name] = {"bytes": size, "crc32": crc}
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "steps": steps,
            "rows": self.total,
            "model": {**dataclasses.asdict(spec)},
            "data": None if data is None else dataclasses.asdict(data),
            "files": files,
        }
        text = json.dumps(manifest, indent=1, sort_keys=True)
        atomic_write(self.out / MANIFEST, lambda f: f.write(text.encode()))
        try:
            replace_dir(self.out, self.final, is_export_bundle)
        except ValueError as exc:
            raise BundleError(str(exc)) from None


@dataclass
class Bundle:
    path: Path
    spec: ModelSpec
    data: DataSpec | None  # None: a version 1 bundle, which did not record it
    steps: int  # steps trained (a version 1 bundle's last step + 1)
    dense: dict[str, torch.Tensor]
    keys: np.ndarray  # memory-mapped
    rows: np.ndarray  # memory-mapped


def open_bundle(path: str | Path, check: bool = True) -> Bundle:
    """Reads the manifest and the dense state, maps the rows; ``check`` verifies every file's
    size and crc32 first."""
    path = Path(path)
    try:
        m = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BundleError(f"bundle {path}: no {MANIFEST} (not an export, or unfinished)") from None
    except (OSError, ValueError) as exc:
        raise BundleError(f"bundle {path / MANIFEST}: unreadable ({exc})") from None
    if m.get("format") != FORMAT or m.get("version") not in READABLE_VERSIONS:
        raise BundleError(
            f"bundle {path / MANIFEST}: not a {FORMAT} manifest of version "
            f"{' or '.join(map(str, READABLE_VERSIONS))} (format {m.get('format')!r}, version "
            f"{m.get('version')!r})"
        )
    for name, entry in m["files"].items():
        if check:
            size, crc = file_crc32(path / name)
            if (size, crc) != (entry["bytes"], entry["crc32"]):
                raise BundleError(
                    f"bundle {path / name}: corrupt or truncated ({size} bytes, "
                    f"crc32 {crc:08x}; the manifest says {entry['bytes']}, "
                    f"{entry['crc32']:08x})"
                )
    model = dict(m["model"])
    spec = ModelSpec(
        **{**model, "bot_mlp": tuple(model["bot_mlp"]), "top_mlp": tuple(model["top_mlp"])}
    )
    dense = torch.load(path / DENSE, map_location="cpu", weights_only=True)
    keys = np.load(path / KEYS, mmap_mode="r")
    rows = np.load(path / ROWS, mmap_mode="r")
    if keys.shape != (m["rows"],) or rows.shape != (m["rows"], spec.dim):
        raise BundleError(
            f"bundle {path}: arrays of shapes {keys.shape}, {rows.shape} for "
            f"{m['rows']} rows of dim {spec.dim}"
        )
    d = m.get("data")
    data = None
    if d is not None:
        sizes = d.get("num_embeddings_per_feature")
        data = DataSpec(
            **{**d, "num_embeddings_per_feature": None if sizes is None else tuple(sizes)}
        )
    steps = int(m["steps"]) if "steps" in m else int(m["step"]) + 1  # version 1: the last step
    return Bundle(path, spec, data, steps, dense, keys, rows)
