#!/usr/bin/env bash
# The main job on its embedded default: set-up when needed, then train the default DLRM on the
# synthetic Criteo-like stream with 2 workers and 1 PS shard under mpirun.
#   bash scripts/run.sh [launcher flags...]      e.g. --max_step 100 --metrics-out run.jsonl
# NP (default 3) and WORKERS (default 2) choose the layout.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
bash "$ROOT/scripts/setup.sh" >&2
source "$ROOT/scripts/env.sh"
NP="${NP:-3}"; WORKERS="${WORKERS:-2}"
exec mpirun -np "$NP" "$ROOT/.venv/bin/python" "$ROOT/launcher.py" --worker-num "$WORKERS" "$@"
