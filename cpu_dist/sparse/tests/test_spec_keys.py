"""``SPEC_KEYS`` (cpu_dist/common/tables.py) restates one table spec that three other places
also spell out: the wire's ``TableSpec`` message (proto/ps.proto), the shard's
``ShardTableSpec`` (csrc/table_spec.h) and the binding's ``TableSpec`` dict (_ps.pyi).  The
bottom layer cannot read the proto or the extension, so these tests hold the four together:
a field added to one and not to the others fails here, not as a spec a shard refuses."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from cpu_dist.common.tables import SPEC_KEYS, TableConfig

pytestmark = pytest.mark.timeout(60)

SPARSE = Path(__file__).resolve().parents[1]


def test_spec_keys_are_the_proto_table_spec_fields_in_order(pb):
    fields = sorted(pb[0].TableSpec.DESCRIPTOR.fields, key=lambda f: f.number)
    assert tuple(f.name for f in fields) == SPEC_KEYS


def test_spec_keys_are_the_shards_table_spec_members_in_order():
    """The C++ struct's data members, those not on the wire (``flag_declared``) apart."""
    text = (SPARSE / "csrc" / "table_spec.h").read_text()
    body = re.search(r"struct ShardTableSpec \{(.*?)\n\};", text, re.S)
    assert body is not None, "csrc/table_spec.h: no struct ShardTableSpec"
    member = re.compile(r"^  [A-Za-z_][\w:<>]*\s+(\w+)\s*(?:\{[^}]*\}|=[^;]*);", re.M)
    members = tuple(member.findall(body.group(1)))
    assert members == (*SPEC_KEYS, "flag_declared")


def test_spec_keys_are_the_bindings_spec_dict_and_the_jobs():
    tree = ast.parse((SPARSE / "_ps.pyi").read_text())
    spec = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TableSpec")
    keys = tuple(
        s.target.id
        for s in spec.body
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
    )
    assert keys == SPEC_KEYS
    assert tuple(TableConfig("t", 4, ("cat_0",)).spec(seed=0)) == SPEC_KEYS
