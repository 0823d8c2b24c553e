#!/usr/bin/env bash
# Build and install the native extensions into .venv (editable). Serialised by a lock.
set -euo pipefail
cd "$(dirname "$0")/.."
exec 9>/tmp/cpu_dist_build.lock
flock 9
.venv/bin/pip install --no-build-isolation --no-deps -q -e . 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import cpu_dist.sparse._ps" 
