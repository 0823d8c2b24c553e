"""Job files the integration tests share: the three tables of widths 4, 16 and 64 (SGD,
row-wise Adagrad, Adagrad) over the 26 categorical features, each test adding its own keys."""

from __future__ import annotations

import json
from collections.abc import Mapping

THREE_TABLES = (  # name, dim, optimizer, features
    ("narrow", 4, "sgd", range(9)),
    ("mid", 16, "rowwise_adagrad", range(9, 17)),
    ("wide", 64, "adagrad", range(17, 26)),
)


def three_tables(**extra: Mapping[str, object]) -> str:
    """The ``[[tables]]`` of :data:`THREE_TABLES`, table ``name`` with the keys ``extra[name]``
    (TOML scalars: strings, numbers; an ``optimizer`` there replaces the table's)."""
    out = []
    for name, dim, optimizer, features in THREE_TABLES:
        keys = dict(extra.get(name, {}))
        cats = ", ".join(f'"cat_{i}"' for i in features)
        lines = ["[[tables]]", f'name = "{name}"', f"dim = {dim}", f"features = [{cats}]"]
        lines.append(f'optimizer = "{keys.pop("optimizer", optimizer)}"')
        lines += [f"{k} = {json.dumps(v)}" for k, v in keys.items()]
        out.append("\n".join(lines))
    return "\n\n".join(out) + "\n"
