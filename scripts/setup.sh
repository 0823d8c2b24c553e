#!/usr/bin/env bash
# Idempotent set-up: Debian packages (only when missing), .venv, pinned torch, the project.
# A second run changes nothing and finishes in seconds.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

APT_PACKAGES=(openmpi-bin libopenmpi-dev libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev
              protobuf-compiler zlib1g-dev cmake g++ pkg-config clang-format librocksdb-dev
              libisal-dev)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
pip_q() { "$VPY" -m pip install -q --disable-pip-version-check "$@" 2>&1 | grep -v "^WARNING: Location" || true; }

# torch is pinned: this version is a CPU build on these machines; anything else pulls CUDA.
TORCH_VERSION=2.13.0
if ! "$VPY" -c "import torch,sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
  echo "setup: installing torch==$TORCH_VERSION"
  pip_q "torch==$TORCH_VERSION"
fi

# Build tools and Python dependencies (once; a stamp records the pyproject they came from).
STAMP=.venv/.cpu_dist-deps
want="$(sha1sum pyproject.toml | cut -c1-40)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing Python dependencies"
  pip_q "torch==$TORCH_VERSION" scikit-build-core pybind11 ninja cmake
  deps=$("$VPY" - <<'PYEOF'
import tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
print(" ".join(p["dependencies"] + p["optional-dependencies"]["test"]))
PYEOF
)
  # shellcheck disable=SC2086
  pip_q "torch==$TORCH_VERSION" $deps
  echo "$want" > "$STAMP"
fi

# The native extensions: rebuilt only when a C++ source, the proto or the build files change.
BSTAMP=.venv/.cpu_dist-build
bwant="$(find proto cpu_dist gpu_cache CMakeLists.txt pyproject.toml -type f \
          \( -name '*.cc' -o -name '*.h' -o -name '*.proto' -o -name 'CMakeLists.txt' -o -name 'pyproject.toml' \) \
          -print0 | sort -z | xargs -0 sha1sum | sha1sum | cut -c1-40)"
if [ "$(cat "$BSTAMP" 2>/dev/null)" != "$bwant" ] || ! "$VPY" -c "import cpu_dist.sparse._ps" 2>/dev/null; then
  echo "setup: building the native extensions"
  bash scripts/build.sh
  echo "$bwant" > "$BSTAMP"
fi
echo "setup: ready ($("$VPY" -c 'import torch; print("torch", torch.__version__)'))"
