#!/usr/bin/env bash
# Sets everything up and runs the whole test suite (what .ci/run runs): the virtual environment,
# the default model (built once), a private PostgreSQL on 127.0.0.1, Debian's Chromium for the
# dashboard's browser test, then pytest over tests/.
# Extra arguments go to pytest (e.g. scripts/test.sh tests/unit -x).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/browser.sh
export LIVELOOP_REQUIRE_BROWSER=1
PG_URL=$(bash scripts/postgres.sh start)
export LIVELOOP_TEST_PG_URL=$PG_URL
export LIVELOOP_REQUIRE_PG=1
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
.venv/bin/liveloop model init >/dev/null
set +e
.venv/bin/python -m pytest -p no:cacheprovider -ra --durations=30 "${@:-tests}"
rc=$?
set -e
bash scripts/postgres.sh stop
exit $rc
