#!/usr/bin/env bash
# Build and install the native extensions into .venv (editable). Serialised by a lock so that
# two builds never share the build directory.
set -euo pipefail
cd "$(dirname "$0")/.."
exec 9>/tmp/cpu_dist_build.lock
flock 9
log=$(mktemp)
if ! .venv/bin/python -m pip install --no-build-isolation --no-deps -q -e . >"$log" 2>&1; then
  grep -v "^WARNING: Location" "$log" >&2; rm -f "$log"; exit 1
fi
rm -f "$log"
.venv/bin/python -c "import cpu_dist.sparse._ps"
