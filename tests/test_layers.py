"""The package layering of docs/DESIGN.md ("Layout"), enforced: every import of our own code
(at module level, inside functions, under TYPE_CHECKING; tests included) points down the
layers, modules import each other without cycles, and the bottom packages import without the
native parameter-server module (a serving process must score without it)."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(120)

# package -> the packages it may import (besides itself)
ALLOWED = {
    "common": set(),
    # TorchRec's API (configs, jagged tensors, collections): torch and common only, so the
    # models, serving and the job can all build on it.
    "embeddings": {"common"},
    # data/features.py: a batch as the KeyedJaggedTensor a model takes (embeddings imports
    # torch and common only, so data still imports without the native modules)
    "data": {"embeddings", "common"},
    "models": {"embeddings", "common"},
    "dense": {"common"},
    "sparse": {"common"},
    "checkpoint": {"sparse", "common"},
    "cache": {"sparse", "data", "common"},
    # serving scores an export without the native module
    "serving": {"models", "embeddings", "data", "common"},
    "export": {"serving", "checkpoint", "sparse", "models", "embeddings", "data", "common"},
    "train": {
        "export",
        "serving",
        "cache",
        "checkpoint",
        "dense",
        "sparse",
        "models",
        "embeddings",
        "data",
        "common",
    },
    # the single-process reference: the job's model (train.job_model), its dump
    # (train.dump) and dense optimizer, trained in one process; nothing imports it back
    "reference": {"train", "dense", "models", "embeddings", "data", "common"},
    "testing": {"common"},  # support for tests and benchmarks (the network lab)
    # the worked examples: a user's model sees the public embeddings API only
    "examples": {"embeddings"},
}
TEST_SUPPORT = {"testing"}  # a package's tests (``<package>/tests``) may import these too


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "gpu_cache":
        return "cache"
    if parts[0] == "cpu_dist" and len(parts) > 1 and parts[1] in ALLOWED:
        return parts[1]
    return None


def first_party_modules() -> dict[str, Path]:
    out = {}
    for top in ("cpu_dist", "gpu_cache"):
        for p in (ROOT / top).rglob("*.py"):
            out[module_name(p)] = p
    return out


def imports_of(module: str, path: Path, known: dict[str, Path], top_level_only: bool):
    """First-party modules ``module`` imports (``from pkg import sub`` counts as ``pkg.sub``)."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    nodes = tree.body if top_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_pkg else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                yield sub if sub in known else base


def test_every_import_points_down_the_layers():
    known = first_party_modules()
    bad = []
    for mod, path in known.items():
        src = package_of(mod)
        if src is None:
            continue
        for target in imports_of(mod, path, known, top_level_only=False):
            dst = package_of(target)
            # What tests share (standalone shards, the network lab) serves every package's tests.
            allowed = ALLOWED[src] | (TEST_SUPPORT if ".tests." in f"{mod}." else set())
            if dst is not None and dst != src and dst not in allowed:
                bad.append(f"{path.relative_to(ROOT)}: {src} -> {dst} ({target})")
    assert not bad, "imports against the layering:\n" + "\n".join(sorted(bad))


def test_no_module_level_import_cycle():
    known = first_party_modules()
    graph = {
        m: {t for t in imports_of(m, p, known, top_level_only=True) if t in known and t != m}
        for m, p in known.items()
    }
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return [*stack[stack.index(n) :], n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = visit(m)
            assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_bottom_packages_import_without_the_native_modules():
    script = textwrap.dedent(
        """
        import importlib, pkgutil, sys

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name in ("cpu_dist.sparse._ps", "cpu_dist.sparse._ps_client",
                            "gpu_cache._metadata"):
                    raise ImportError(f"{name} is blocked in this test")
                return None

        sys.meta_path.insert(0, Block())
        import cpu_dist.common, cpu_dist.data, cpu_dist.embeddings, cpu_dist.models
        import cpu_dist.serving
        packages = (cpu_dist.common, cpu_dist.data, cpu_dist.embeddings, cpu_dist.models,
                    cpu_dist.serving)
        for pkg in packages:
            for info in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + "."):
                if not info.name.endswith(".tests"):
                    importlib.import_module(info.name)
        assert "cpu_dist.sparse._ps" not in sys.modules
        assert "cpu_dist.sparse._ps_client" not in sys.modules
        print("ok")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=100
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
