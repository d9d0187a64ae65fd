#!/usr/bin/env bash
# Runs the test tiers: `scripts/test.sh` all three (unit, integration, e2e), `scripts/test.sh TIER
# [pytest args]` one of them. Installs Debian's chromium, postgresql, prometheus, nodejs and npm when
# missing, installs the pinned Node clients of tests/integration/clients (npm ci), starts a
# PostgreSQL cluster for the database tests (and stops it again if this script started it). Each
# tier prints how long it took, and its slowest tests.
set -euo pipefail
cd "$(dirname "$0")/.."

tiers=(unit integration e2e)
case "${1:-}" in
  unit | integration | e2e) tiers=("$1"); shift ;;
esac

need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v pg_ctlcluster >/dev/null 2>&1 || need+=(postgresql)
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]} (apt)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

# The Node clients the real-client tests run (openai, ai, @ai-sdk/*, zod), exactly as locked.
npm ci --prefix tests/integration/clients/node --no-audit --no-fund --loglevel=error --prefer-offline

PG_VERSION=$(ls /usr/lib/postgresql | sort -V | tail -1)
if ! pg_lsclusters -h | awk -v v="$PG_VERSION" '$1==v && $2=="main"' | grep -q .; then
  pg_createcluster "$PG_VERSION" main >/dev/null
fi
started_pg=0
if ! pg_lsclusters -h | awk -v v="$PG_VERSION" '$1==v && $2=="main" && $4=="online"' | grep -q .; then
  pg_ctlcluster "$PG_VERSION" main start
  started_pg=1
fi
cleanup() { if [ "$started_pg" = 1 ]; then pg_ctlcluster "$PG_VERSION" main stop || true; fi; }
trap cleanup EXIT

for _ in $(seq 1 30); do
  su postgres -c "pg_isready -q -h 127.0.0.1 -p 5432" && break
  sleep 1
done
su postgres -c "psql -tAc \"select 1 from pg_roles where rolname='ci'\"" | grep -q 1 \
  || su postgres -c "psql -q -c \"create role ci login password 'ci' superuser\""
su postgres -c "psql -tAc \"select 1 from pg_database where datname='gateway_test'\"" | grep -q 1 \
  || su postgres -c "createdb -O ci gateway_test"

export TEST_POSTGRES_URL="postgresql+psycopg://ci:ci@127.0.0.1:5432/gateway_test"
export REQUIRE_POSTGRES=1
# Bytecode caches on even where the environment turns them off: without them every pytest worker
# and every process a test starts compiles the whole tree again (and pytest rewrites every test
# module's asserts again), about 10 s of CPU per process.
unset PYTHONDONTWRITEBYTECODE
status=0
tier() {
  local name=$1 start=$SECONDS
  shift
  "$@" || status=$?
  echo "== tier $name: $((SECONDS - start)) s"
}
for t in "${tiers[@]}"; do
  case $t in
    # No processes, no sockets, no PostgreSQL (tests/unit/conftest.py enforces it).
    unit) tier unit .venv/bin/python -m pytest tests/unit -m "not postgres" -n 2 --dist worksteal --durations=10 "$@" ;;
    # Real processes, loopback upstreams, PostgreSQL, real clients; and the unit tier's database
    # tests on PostgreSQL. worksteal: a worker that runs out of tests takes over the other's queue,
    # so one file of minutes does not end the run alone; module-scoped fixtures (one serve process
    # for a file's tests) still hold, a stolen test starting its own copy on the other worker.
    integration) tier integration .venv/bin/python -m pytest tests/integration tests/unit \
      -m "integration or postgres" -n 2 --dist worksteal --durations=15 "$@" ;;
    # Two workers (pytest-xdist): tests/e2e/conftest.py's scheduler keeps the tests of each
    # shared server on one worker, in file order, and hands every other file (with its own server) to
    # whichever worker is free, longest first. Most of a browser test is waiting (for a page's run,
    # a refresh, a real-time window), so two overlap well on two cores; every wait is a bounded
    # condition, none a timed assertion.
    e2e) tier e2e .venv/bin/python -m pytest tests/e2e -n 2 --durations=15 "$@" ;;
  esac
done
exit $status
