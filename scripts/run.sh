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
# SIGTERM or SIGINT to this script reaches the ranks at once as SIGUSR1, which mpirun forwards
# (a SIGTERM to mpirun itself starts OpenMPI's kill sequence instead): a job with
# --checkpoint-dir checkpoints at the next step boundary and this script exits 75.
mpirun -np "$NP" "$ROOT/.venv/bin/python" "$ROOT/launcher.py" --worker-num "$WORKERS" "$@" &
pid=$!
trap 'kill -USR1 "$pid" 2>/dev/null || true' TERM INT
while :; do
    rc=0
    wait "$pid" || rc=$?
    kill -0 "$pid" 2>/dev/null || break # wait returned for the trap: mpirun still runs
done
exit "$rc"
