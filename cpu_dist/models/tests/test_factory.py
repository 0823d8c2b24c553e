"""The model factory: built-in names, ``PKG.MODULE:FUNC`` and ``path/to/file.py:FUNC``
specs, the checks on what a factory builds, and errors that name the spec and the fault."""

from __future__ import annotations

import hashlib
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from cpu_dist.embeddings import EmbeddingBagConfig
from cpu_dist.models.dcnv2 import DLRMDCNv2, dcnv2
from cpu_dist.models.factory import (
    BUILTIN_MODELS,
    ModelError,
    build_model,
    parse_model_spec,
    resolve_model,
    source_sha256,
)

pytestmark = pytest.mark.timeout(60)

TABLES = [
    EmbeddingBagConfig(0, 4, "users", feature_names=["user"]),
    EmbeddingBagConfig(0, 8, "items", feature_names=["clicked", "item"], pooling="mean"),
]
SMALL = {"bot_mlp": [4], "top_mlp": [1], "num_layers": 1, "low_rank_dim": 2}

USER_FILE = """
import torch
from torch import nn
from cpu_dist.embeddings import EmbeddingBagCollection, EmbeddingBagConfig

class Model(nn.Module):
    def __init__(self, tables, dense_features, width):
        super().__init__()
        self.inner = nn.ModuleDict({"ebc": EmbeddingBagCollection(tables)})
        n = sum(t.embedding_dim * len(t.feature_names) for t in tables)
        self.head = nn.Linear(n + dense_features, width)

    def forward(self, dense, sparse):
        return self.head(torch.cat([self.inner["ebc"](sparse).values(), dense], 1)).sum(1)

def build(tables, dense_features, width=3):
    return Model(tables, dense_features, width)

def no_collection(tables, dense_features):
    return nn.Linear(dense_features, 1)

def not_a_module(tables, dense_features):
    return {"model": 1}

def other_table(tables, dense_features):
    return Model([EmbeddingBagConfig(0, 4, "elsewhere", feature_names=["x"])], dense_features, 1)

def one_table_only(tables, dense_features):
    return Model(tables[:1], dense_features, 1)

def changed_width(tables, dense_features):
    import dataclasses
    return Model([dataclasses.replace(t, embedding_dim=5) for t in tables], dense_features, 1)

class OneArgument(Model):
    def forward(self, batch):
        return batch

def one_argument(tables, dense_features):
    return OneArgument(tables, dense_features, 1)

def raises(tables, dense_features):
    raise RuntimeError("no GPU here")

NOT_CALLABLE = 7
"""


@pytest.fixture()
def user_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_model.py"
    path.write_text(textwrap.dedent(USER_FILE))
    return path


def test_builtin_dcnv2_resolves_to_the_factory_and_builds_deterministically():
    assert resolve_model("dcnv2") is dcnv2
    assert "dcnv2" in BUILTIN_MODELS
    first = build_model("dcnv2", TABLES, 3, SMALL, seed=5)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    second = build_model("dcnv2", TABLES, 3, SMALL, seed=5)
    assert torch.equal(torch.get_rng_state(), state)  # the caller's RNG is left alone
    assert isinstance(first, DLRMDCNv2)
    a, b = first.state_dict(), second.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert source_sha256("dcnv2") is None


def test_a_user_file_loads_by_path_outside_the_package_and_builds(user_file: Path):
    spec = f"{user_file}:build"
    factory = resolve_model(spec)
    module = sys.modules[factory.__module__]
    assert module.__name__.startswith("cpu_dist_user_model_my_model_")
    assert not module.__name__.startswith("cpu_dist.")
    assert resolve_model(spec) is factory  # loaded once for one (path, content)
    model = build_model(spec, TABLES, 2, {"width": 2})
    assert type(model).__name__ == "Model" and model.head.out_features == 2
    assert source_sha256(spec) == hashlib.sha256(user_file.read_bytes()).hexdigest()
    # a relative path with a directory part is a file too
    assert parse_model_spec("models/two.py:f").kind == "file"


def test_two_files_of_one_name_do_not_collide(tmp_path: Path, user_file: Path):
    other = tmp_path / "sub" / "my_model.py"
    other.parent.mkdir()
    other.write_text("def build(tables, dense_features):\n    return 'the other one'\n")
    assert resolve_model(f"{other}:build") is not resolve_model(f"{user_file}:build")
    assert resolve_model(f"{other}:build")(None, 0) == "the other one"


def test_a_module_spec_imports_the_module():
    spec = "cpu_dist.models.dcnv2:dcnv2"
    assert resolve_model(spec) is dcnv2
    assert parse_model_spec(spec).kind == "module"
    src = Path(__file__).resolve().parents[1] / "dcnv2.py"
    assert source_sha256(spec) == hashlib.sha256(src.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    "spec, pattern",
    [
        ("dlrm2", r"model 'dlrm2': unknown built-in model \(built-in: dcnv2, dlrm\)"),
        ("", r"model '': expected a built-in name"),
        (
            "no_such_pkg.mod:f",
            r"model 'no_such_pkg.mod:f': cannot import no_such_pkg.mod: ModuleNotFoundError: "
            r"No module named 'no_such_pkg' \(install it or put its directory on PYTHONPATH",
        ),
        (
            "cpu_dist.models.dcnv2:nothing",
            r"cpu_dist.models.dcnv2 has no 'nothing' \(its "
            r"callables: .*dcnv2",
        ),
        ("cpu_dist.models.dcnv2:", r"'' is not a function name"),
        ("bad name!:f", r"'bad name!' is neither a dotted module name nor a .py file"),
        ("/no/such/dir/model.py:build", r"/no/such/dir/model.py does not exist"),
    ],
)
def test_resolve_errors_name_the_spec_and_the_fault(spec, pattern):
    with pytest.raises(ModelError, match=pattern):
        resolve_model(spec)


def test_file_errors_name_the_file(tmp_path: Path, user_file: Path):
    broken = tmp_path / "broken.py"
    broken.write_text("def build(:\n")
    with pytest.raises(ModelError, match=r"loading .*broken.py failed: SyntaxError"):
        resolve_model(f"{broken}:build")
    failing = tmp_path / "failing.py"
    failing.write_text("import no_such_dependency_here\n")
    with pytest.raises(ModelError, match=r"failing.py failed: ModuleNotFoundError"):
        resolve_model(f"{failing}:build")
    with pytest.raises(ModelError, match=r"my_model.py:NOT_CALLABLE is a int, not callable"):
        resolve_model(f"{user_file}:NOT_CALLABLE")
    (tmp_path / "folder.py").mkdir()
    with pytest.raises(ModelError, match=r"folder.py is not a file"):
        resolve_model(f"{tmp_path}/folder.py:build")


@pytest.mark.parametrize(
    "func, pattern",
    [
        ("no_collection", r"the Linear it built owns no EmbeddingBagCollection"),
        ("not_a_module", r"the factory returned a dict, expected an nn.Module"),
        (
            "other_table",
            r"collection 'inner.ebc' holds table 'elsewhere', which is not one of the job's tables "
            r"\(users, items\)",
        ),
        ("one_table_only", r"table 'items' is in no EmbeddingBagCollection"),
        (
            "changed_width",
            r"collection 'inner.ebc' changed table 'users': embedding_dim 5, "
            r"the job's 4 \(pass",
        ),
        ("raises", r"building it failed: RuntimeError: no GPU here"),
        (
            "one_argument",
            r"OneArgument.forward\(batch\) cannot be called as forward\(dense, sparse\): too "
            r"many positional arguments",
        ),
    ],
)
def test_what_a_factory_builds_is_checked(user_file: Path, func, pattern):
    with pytest.raises(ModelError, match=rf"model '.*my_model.py:{func}': {pattern}"):
        build_model(f"{user_file}:{func}", TABLES, 2)


def test_an_unexpected_argument_is_the_type_errors_text_with_the_spec(user_file: Path):
    with pytest.raises(
        ModelError,
        match=r"model 'dcnv2': dcnv2\(\) got an unexpected keyword argument "
        r"'low_rank' \(its arguments: tables, dense_features, bot_mlp, top_mlp, num_layers, "
        r"low_rank_dim, seed\)",
    ):
        build_model("dcnv2", TABLES, 3, {"low_rank": 4})
    with pytest.raises(
        ModelError,
        match=r"my_model.py:build'.*missing a required|"
        r"my_model.py:build'.*unexpected keyword argument 'depth'",
    ):
        build_model(f"{user_file}:build", TABLES, 2, {"depth": 2})
    # a model's own argument check keeps its text, under the spec
    with pytest.raises(
        ModelError,
        match=r"model 'dcnv2': building it failed: ValueError: "
        r"top_mlp \[2\]: the last width must be 1",
    ):
        build_model("dcnv2", TABLES, 3, {**SMALL, "top_mlp": [2]})


def test_a_module_whose_own_import_fails_shows_that_cause(tmp_path: Path, monkeypatch):
    pkg = tmp_path / "h8_user_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text("import h8_absent_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModelError) as err:
        resolve_model("h8_user_pkg.models:build")
    text = str(err.value)
    assert "cannot import h8_user_pkg.models: ModuleNotFoundError: No module named " in text
    assert "'h8_absent_dependency'" in text and "PYTHONPATH" not in text  # not a path problem


def test_the_launchers_builtin_names_are_the_factorys():
    """cpu_dist.common checks --model before MPI starts without importing torch, from its own
    list of built-in names: it must be the factory's."""
    from cpu_dist.common.config import BUILTIN_MODEL_NAMES, model_spec_problem

    assert BUILTIN_MODEL_NAMES == tuple(BUILTIN_MODELS)
    for spec in ("dlrm", "dcnv2", "dlmr", "pkg.mod:build", "a/b.py:f", "x:1bad", "bad mod:f", ":f"):
        try:
            parse_model_spec(spec)
            parses = True
        except ModelError:
            parses = False
        assert (model_spec_problem(spec) is None) == parses, spec
