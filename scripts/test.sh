#!/usr/bin/env bash
# Sets everything up and runs the whole test suite (what .ci/run runs): the virtual environment,
# the default model (built once), a private PostgreSQL on 127.0.0.1, Debian's Chromium for the
# dashboard's browser test, the pinned agent CLIs (Codex CLI, Claude Code; scripts/agents.sh), then pytest over tests/ (two processes side by side: see below).
# Extra arguments go to pytest (e.g. scripts/test.sh tests/unit -x).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/browser.sh
export LIVELOOP_REQUIRE_BROWSER=1
LIVELOOP_AGENTS_BIN=$(bash scripts/agents.sh)   # empty where npm is missing: those tests skip, saying so
export LIVELOOP_AGENTS_BIN
PG_URL=$(bash scripts/postgres.sh start)   # no password in it: libpq reads it from PGPASSFILE (0600)
export LIVELOOP_TEST_PG_URL=$PG_URL
export PGPASSFILE=$(bash scripts/postgres.sh passfile)
export LIVELOOP_REQUIRE_PG=1
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
.venv/bin/liveloop model init --config tiny >/dev/null   # the tests' model (SmolLM2 is imported by the tests that use it)
PYTEST=(.venv/bin/python -m pytest -p no:cacheprovider -ra)
if [ $# -gt 0 ] || [ "${LIVELOOP_TEST_STREAMS:-2}" = 1 ]; then
  set +e
  "${PYTEST[@]}" --durations=30 "${@:-tests}"
  rc=$?
  set -e
else
  # The whole suite as two pytest processes side by side, one per core: the learning tests (long,
  # single-threaded end-to-end runs that leave the second core idle) and everything else. Each has its
  # own temp root; PostgreSQL databases, ports and Ray clusters are per test already. The learning
  # stream's log is printed when both are done; LIVELOOP_TEST_STREAMS=1 runs one process instead.
  LOGS=$(mktemp -d)
  set +e
  "${PYTEST[@]}" --durations=15 --basetemp="$LOGS/tmp-learning" -m learning tests > "$LOGS/learning.log" 2>&1 &
  learning=$!
  "${PYTEST[@]}" --durations=30 --basetemp="$LOGS/tmp-main" -m "not learning" tests
  main_rc=$?
  wait $learning
  learning_rc=$?
  set -e
  echo; echo "=================== the learning tests (run beside the others) ==================="
  cat "$LOGS/learning.log"
  echo "main stream: exit $main_rc; learning stream: exit $learning_rc"
  rc=$(( main_rc != 0 ? main_rc : learning_rc ))
  rm -rf "$LOGS"
fi
bash scripts/postgres.sh stop
exit $rc
