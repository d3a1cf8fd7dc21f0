#!/usr/bin/env bash
# Sets up everything liveloop needs in ./.venv, exactly as the lock says, idempotently: a second run with
# nothing changed takes about a second. The lock (requirements/cpu.lock, or requirements/cuda.lock on a
# machine with an NVIDIA GPU) pins every distribution with the sha256 of its file; pip installs that set
# and nothing else (--require-hashes --no-deps), then liveloop itself (editable, no dependencies), then
# scripts/lock.py checks the venv against the lock, on every run: a venv that differs fails (CI too).
# pyproject.toml keeps ranges for library users; scripts/lock.sh refreshes the locks from them
# (docs/design.md, "A locked environment").
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${LIVELOOP_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then KIND=cuda; else KIND=cpu; fi
LOCK=$ROOT/requirements/$KIND.lock
[ -f "$LOCK" ] || { echo "[setup] no lock for this machine: $LOCK (run scripts/lock.sh)" >&2; exit 1; }

stamp_input() {
  cat "$ROOT/pyproject.toml" "$ROOT/scripts/setup.sh" "$LOCK"
  echo "$KIND"
}
want=$(stamp_input | sha256sum | cut -d' ' -f1)
check() { "$VENV/bin/python" "$ROOT/scripts/lock.py" check "$LOCK" --python "$VENV/bin/python"; }
if [ -x "$VENV/bin/liveloop" ] && [ "$(cat "$VENV/.liveloop-stamp" 2>/dev/null)" = "$want" ]; then
  check >/dev/null || { check; exit 1; }  # something changed the venv behind the lock's back: fail
  exit 0
fi

echo "[setup] $VENV from $(basename "$LOCK") (a few minutes the first time)"
# a venv made from another lock may hold what this one does not: start afresh
rm -rf "$VENV"
"$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --require-hashes --no-deps -r "$LOCK"
"${PIP[@]}" install -q --no-deps --no-build-isolation -e "$ROOT"
check
echo "$want" > "$VENV/.liveloop-stamp"
echo "[setup] done"
