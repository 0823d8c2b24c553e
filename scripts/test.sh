#!/usr/bin/env bash
# The whole test suite: set-up when needed, then
#   0. static checks: ruff (lint and format), mypy on cpu_dist and gpu_cache, clang-format,
#   1. unit and integration tests (integration tests start real mpirun jobs and PS processes),
#   2. the pytest-mpi tests under mpirun with 3 and then 4 ranks (oversubscribed).
# Rank 0 prints to the console; other ranks write logs/mpi-np<N>-rank<R>.log, shown when a
# phase fails.  Every phase has a wall-clock limit.  Before the last line it lists every
# skipped test with its reason (scripts/suite_report.py); the last line is
# "N passed, N failed, N skipped" over all phases.  Extra arguments go to every pytest run
# (e.g. -k commit).
# Environment:
#   CPU_DIST_REQUIRE=netlab,slurm  a skip of those test groups fails (tests/skip_policy.py)
#   CPU_DIST_TEST_PHASES="unit mpi-np3"  run only these of: static unit mpi-np3 mpi-np4
#   CPU_DIST_TEST_LOGS=DIR  results there instead of logs/ (its old results removed first)
#   CPU_DIST_SKIP_SETUP=1  do not run scripts/setup.sh (the environment is known to be ready)
#   CPU_DIST_TEST_UNIT_LIMIT_S=3600  the unit phase's wall-clock limit; at it pytest gets SIGINT
#     and still writes its summary and JUnit XML, so the tests it finished are counted
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
ALL_PHASES="static unit mpi-np3 mpi-np4"
PHASES="${CPU_DIST_TEST_PHASES:-$ALL_PHASES}"
for p in $PHASES; do
  case " $ALL_PHASES " in *" $p "*) ;; *)
    echo "CPU_DIST_TEST_PHASES: unknown phase '$p' (phases: $ALL_PHASES)" >&2
    echo "0 passed, 1 failed, 0 skipped"; exit 2 ;;
  esac
done
wanted() { case " $PHASES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
if [ "${CPU_DIST_SKIP_SETUP:-0}" != 1 ]; then
  bash scripts/setup.sh || { echo "0 passed, 1 failed, 0 skipped"; exit 1; }
fi
source scripts/env.sh
PY="$ROOT/.venv/bin/python"
if [ -n "${CPU_DIST_TEST_LOGS:-}" ]; then  # the caller's folder: remove only what a run writes
  LOGS="$CPU_DIST_TEST_LOGS"
  mkdir -p "$LOGS" || { echo "0 passed, 1 failed, 0 skipped"; exit 1; }
  rm -f "$LOGS"/*.xml "$LOGS"/*.log "$LOGS/skipped.txt"
else
  LOGS="$ROOT/logs"; rm -rf "$LOGS"; mkdir -p "$LOGS"
fi
SKIPS="$LOGS/skipped.txt"; : >"$SKIPS"
# Bytecode is cached under build/ (ignored by git), not beside the sources: every rank of every
# job a test starts would otherwise compile cpu_dist again (~0.3 s of CPU a worker).
unset PYTHONDONTWRITEBYTECODE
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX="$ROOT/build/pycache"
# -p tests.skip_policy: CPU_DIST_REQUIRE holds also for test files outside the checkout;
# xunit1: the JUnit XML names each test's file, so skips are listed by pytest node id.
PYTEST=(-m pytest --color=no -p no:cacheprovider -q -rfE -p tests.skip_policy
  -o junit_family=xunit1)
TOTAL_P=0; TOTAL_F=0; TOTAL_S=0; STATUS=0

phase() {  # phase <name> <rc> ; reads logs/<name>.xml, appends its skips to $SKIPS
  local name=$1 rc=$2 p f s
  [ "$rc" -eq 5 ] && rc=0  # pytest: no test selected in this phase (e.g. a -k filter)
  read -r p f s < <("$PY" "$ROOT/scripts/suite_report.py" "$name" "$LOGS/$name.xml" "$SKIPS")
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi  # crashed, aborted or timed out
  [ "$rc" -eq 124 ] && echo "phase $name: stopped at its wall-clock limit; counted: the tests it finished"
  TOTAL_P=$((TOTAL_P + p)); TOTAL_F=$((TOTAL_F + f)); TOTAL_S=$((TOTAL_S + s))
  echo "phase $name: $p passed, $f failed, $s skipped (exit $rc)"
  if [ "$f" -ne 0 ]; then
    STATUS=1
    for log in "$LOGS/$name"-rank*.log; do
      [ -s "$log" ] || continue
      echo "----- $log (tail) -----"; tail -n 60 "$log"
    done
  fi
}

check() {  # check <name> <command...>: one passed or failed check
  local name=$1; shift
  if "$@" >"$LOGS/check-$name.log" 2>&1; then
    TOTAL_P=$((TOTAL_P + 1)); echo "check $name: passed"
  else
    TOTAL_F=$((TOTAL_F + 1)); STATUS=1; echo "check $name: FAILED"; tail -n 40 "$LOGS/check-$name.log"
  fi
}
if wanted static; then
  echo "== static checks"
  CXX_SOURCES=$(git ls-files '*.h' '*.cc' 2>/dev/null || find cpu_dist gpu_cache -name '*.h' -o -name '*.cc')
  check ruff-lint "$ROOT/.venv/bin/ruff" check .
  check ruff-format "$ROOT/.venv/bin/ruff" format --check .
  check mypy "$ROOT/.venv/bin/mypy"
  # shellcheck disable=SC2086
  check clang-format clang-format --dry-run --Werror $CXX_SOURCES
fi

if wanted unit; then
  echo "== unit and integration tests"
  # The MPI tests run in the MPI phases; here each would be a skip ("need --with-mpi").
  timeout -s INT -k 30 "${CPU_DIST_TEST_UNIT_LIMIT_S:-3600}" \
    "$PY" "${PYTEST[@]}" --junitxml="$LOGS/unit.xml" --ignore=tests/mpi \
    --deselect-mpi "$@"
  phase unit $?
fi

for np in 3 4; do
  name="mpi-np$np"
  wanted "$name" || continue
  echo "== MPI tests, $np ranks"
  timeout -k 10 900 mpirun -np "$np" bash -c '
    if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then exec "$0" "${@:3}" --junitxml="$1/$2.xml";
    else exec "$0" "${@:3}" > "$1/$2-rank$OMPI_COMM_WORLD_RANK.log" 2>&1; fi' \
    "$PY" "$LOGS" "$name" "${PYTEST[@]}" --timeout-method=thread --with-mpi --only-mpi \
    --deselect-non-mpi tests/mpi "$@"
  phase "$name" $?
done

if [ -s "$SKIPS" ]; then
  echo "== skipped: $TOTAL_S (phase, test, reason)"
  cat "$SKIPS"
fi
echo "$TOTAL_P passed, $TOTAL_F failed, $TOTAL_S skipped"
exit $STATUS
