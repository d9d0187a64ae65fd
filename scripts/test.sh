#!/usr/bin/env bash
# Runs the whole test suite: installs Debian's chromium, postgresql, prometheus, nodejs and npm when
# missing, installs the pinned Node clients of tests/clients (npm ci), starts a PostgreSQL cluster
# for the database tests (and stops it again if this script started it), then runs pytest (unit,
# real-client, AppTest page tests and the Playwright browser tests) in two processes.
set -euo pipefail
cd "$(dirname "$0")/.."

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
npm ci --prefix tests/clients/node --no-audit --no-fund --loglevel=error --prefer-offline

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
# Two runs: Playwright's sync API keeps an asyncio loop running in the worker's main thread for the
# whole session, which would break the asyncio tests of the server if they shared a worker with it.
status=0
# worksteal, not loadfile: a worker that runs out of tests takes over the queue of the other, so
# one file of minutes (real serve processes, a throwaway PostgreSQL) no longer ends the run alone.
# Module-scoped fixtures (one serve process for a file's tests) still hold: a stolen test starts
# its own copy of the fixture on the other worker.
.venv/bin/python -m pytest -n 2 --dist worksteal -m "not e2e" "$@" || status=$?
# The browser tests in one process: two Streamlit servers and two Chromiums at once on two cores made
# their waits flaky.
.venv/bin/python -m pytest -m e2e "$@" || status=$?
exit $status
