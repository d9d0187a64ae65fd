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
    # In one process: Playwright's sync API keeps an asyncio loop running in its worker's main
    # thread, and two Streamlit servers with two Chromiums at once on two cores made waits flaky.
    # Two xdist workers need the shared servers' tests kept on one worker, in file order: `--dist
    # loadgroup` cannot do that with the pinned pytest 9 and pytest-xdist 3.8 (xdist tags a group onto
    # `item._nodeid`, which pytest 9 no longer reads; it spread them test by test, every shared server
    # started twice, and 5 of the first 27 tests failed at load 30). tests/e2e/conftest.py's own
    # scheduler does keep them together under `-n 2`, but it stays off: tried once at load 17-30, 46
    # of 49 passed in 1,959 s (one process: 49 in 1,873 s at load 12-19), the three failures the
    # real-time drills' waits (incident, overview banner, the incident server's failure count).
    e2e) tier e2e .venv/bin/python -m pytest tests/e2e --durations=15 "$@" ;;
  esac
done
exit $status
