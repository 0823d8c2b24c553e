#!/usr/bin/env bash
# The whole test suite: set-up when needed, then
#   0. static checks: ruff (lint and format), mypy on cpu_dist and gpu_cache, clang-format,
#   1. unit and integration tests (integration tests start real mpirun jobs and PS processes),
#   2. the pytest-mpi tests under mpirun with 3 and then 4 ranks (oversubscribed).
# Rank 0 prints to the console; other ranks write logs/mpi-np<N>-rank<R>.log, shown when a
# phase fails.  Every phase has a wall-clock limit.  The last line is "N passed, N failed".
# Extra arguments go to every pytest run (e.g. -k commit).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh || { echo "0 passed, 1 failed"; exit 1; }
source scripts/env.sh
PY="$ROOT/.venv/bin/python"
LOGS="$ROOT/logs"; rm -rf "$LOGS"; mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
PYTEST=(-m pytest --color=no -p no:cacheprovider -q -rfE)
TOTAL_P=0; TOTAL_F=0; STATUS=0

count() {  # count <junit.xml> -> "passed failed"
  "$PY" - "$1" <<'PYEOF'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except Exception:
    print(0, 1); sys.exit()
suites = [root] if root.tag == "testsuite" else list(root)
t = sum(int(s.get("tests", 0)) for s in suites)
f = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
sk = sum(int(s.get("skipped", 0)) for s in suites)
print(t - f - sk, f)
PYEOF
}

phase() {  # phase <name> <rc> ; reads logs/<name>.xml
  local name=$1 rc=$2 p f
  [ "$rc" -eq 5 ] && rc=0  # pytest: no test selected in this phase (e.g. a -k filter)
  read -r p f < <(count "$LOGS/$name.xml")
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi  # crashed, aborted or timed out
  TOTAL_P=$((TOTAL_P + p)); TOTAL_F=$((TOTAL_F + f))
  echo "phase $name: $p passed, $f failed (exit $rc)"
  if [ "$f" -ne 0 ]; then
    STATUS=1
    for log in "$LOGS/$name"-rank*.log; do
      [ -s "$log" ] || continue
      echo "----- $log (tail) -----"; tail -n 60 "$log"
    done
  fi
}

echo "== static checks"
check() {  # check <name> <command...>: one passed or failed check
  local name=$1; shift
  if "$@" >"$LOGS/check-$name.log" 2>&1; then
    TOTAL_P=$((TOTAL_P + 1)); echo "check $name: passed"
  else
    TOTAL_F=$((TOTAL_F + 1)); STATUS=1; echo "check $name: FAILED"; tail -n 40 "$LOGS/check-$name.log"
  fi
}
CXX_SOURCES=$(git ls-files '*.h' '*.cc' 2>/dev/null || find cpu_dist gpu_cache -name '*.h' -o -name '*.cc')
check ruff-lint "$ROOT/.venv/bin/ruff" check .
check ruff-format "$ROOT/.venv/bin/ruff" format --check .
check mypy "$ROOT/.venv/bin/mypy"
# shellcheck disable=SC2086
check clang-format clang-format --dry-run --Werror $CXX_SOURCES

echo "== unit and integration tests"
timeout -k 10 2400 "$PY" "${PYTEST[@]}" --junitxml="$LOGS/unit.xml" "$@"
phase unit $?

for np in 3 4; do
  name="mpi-np$np"
  echo "== MPI tests, $np ranks"
  timeout -k 10 900 mpirun -np "$np" bash -c '
    if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then exec "$0" "${@:3}" --junitxml="$1/$2.xml";
    else exec "$0" "${@:3}" > "$1/$2-rank$OMPI_COMM_WORLD_RANK.log" 2>&1; fi' \
    "$PY" "$LOGS" "$name" "${PYTEST[@]}" --timeout-method=thread --with-mpi --only-mpi tests/mpi "$@"
  phase "$name" $?
done

echo "$TOTAL_P passed, $TOTAL_F failed"
exit $STATUS
