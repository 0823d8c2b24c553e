"""A bundle as the module the job trained: :func:`load` rebuilds the model from the bundle's
record with the model factory (a user model from the bundle's copy of its file, or its module
once its source hashes as recorded), loads the dense state, and gives every
``EmbeddingBagCollection`` the bundle's rows (:class:`~cpu_dist.serving.rows.BundleRows`) in
place of its local ones, as a job gives them the parameter server's.  The result is the user's
own module in eval mode, called as the job called it: ``module(dense, KeyedJaggedTensor) ->
logits``.  No MPI, no parameter server, no native module."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from cpu_dist.common.tables import JobTables
from cpu_dist.embeddings import EmbeddingBagConfig, collections_of
from cpu_dist.models.factory import ModelError, build_model
from cpu_dist.serving.bundle import Bundle, BundleError, open_bundle
from cpu_dist.serving.model_record import check_source, table_config
from cpu_dist.serving.rows import BundleRows, TableRows

__all__ = ["bundle_job_tables", "bundle_tables", "load", "load_bundle"]


def bundle_tables(bundle: Bundle) -> list[EmbeddingBagConfig]:
    """The bundle's tables as the model was built with them, in the job's order."""
    where = f"bundle {bundle.path}"
    return [table_config(t.info.record, where) for t in bundle.tables.values()]


def bundle_job_tables(bundle: Bundle) -> JobTables:
    """The job's :class:`JobTables` of the bundle (its tables, its data's feature order and
    whether the one table is the default job's fused one): what ``BatchFeatures`` turns a
    batch into the model's features with, as the job did."""
    tables = tuple(c.to_table_config() for c in bundle_tables(bundle))
    record = bundle.model
    data_features = record.data_features or tuple(f for t in tables for f in t.features)
    try:
        return JobTables(tables, fused=record.fused, data_features=data_features)
    except ValueError as exc:
        raise BundleError(f"bundle {bundle.path}: its tables: {exc}") from None


def _rows(bundle: Bundle) -> BundleRows:
    return BundleRows(
        {
            name: TableRows(
                name, t.keys, t.rows, int(t.info.record["seed"]), float(t.info.record["init_scale"])
            )
            for name, t in bundle.tables.items()
        }
    )


def load_bundle(bundle: Bundle) -> nn.Module:
    """The model of an opened bundle (see the module docstring).

    Raises:
        BundleError: the model's source changed since the export (both hashes named), the
            factory cannot build it (``ModelError``'s text), or the dense state does not fit
            the model it built.
    """
    record = bundle.model
    try:
        spec = check_source(record, bundle.root, bundle.path)
        model = build_model(
            spec, bundle_tables(bundle), record.dense_features, record.args, seed=record.seed
        )
    except ModelError as exc:
        raise BundleError(f"bundle {bundle.path}: {exc}") from None
    if record.dtype == "float64":
        model.to(torch.float64)
    rows = _rows(bundle)
    for _, ebc in collections_of(model):
        ebc.set_row_source(rows)  # before load_state_dict: the rows are not in the state
    try:
        model.load_state_dict(bundle.dense)
    except RuntimeError as exc:
        raise BundleError(
            f"bundle {bundle.path}: its dense state does not fit the model {record.name!r} it "
            f"records: {exc}"
        ) from None
    model.eval()
    return model


def load(bundle: str | Path, *, check: bool = True) -> nn.Module:
    """The trained model of an export bundle, ready to score: ``module(dense [B, F],
    KeyedJaggedTensor) -> logits [B]`` (in eval mode; call it under ``torch.no_grad()``).

    Args:
        bundle: the bundle's directory (``--export DIR``, ``python -m cpu_dist.export``).
        check: verify every file's size and crc32 first.

    Example::

        model = cpu_dist.serving.load("model/")
        with torch.no_grad():
            p = torch.sigmoid(model(dense, kjt))
    """
    return load_bundle(open_bundle(bundle, check=check))
