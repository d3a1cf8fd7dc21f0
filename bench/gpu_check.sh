#!/usr/bin/env bash
# The accelerator check: the learner, the hf engine and the in-memory weight transport on a CUDA GPU,
# on a machine that has python3 with torch and transformers and nothing else (no vLLM, Ray, FastAPI, no
# network). Prints ratings/s at batch 1/4/16, bfloat16 optimizer state against fp32 master weights,
# swap time per transport, engine tokens/s against `generate`, and engine/learner logprob agreement, in
# under 8 minutes (bench/gpu_check.py; each part has its own time limit). Where the python also has SGLang
# (and so httpx), part 6 starts `python -m sglang.launch_server` and runs the sglang engine's contract steps
# against it (up to 5 more minutes; skipped where sglang is not importable; `--sglang-only`: that part alone).
#
#   bash bench/gpu_check.sh --prepare   # here, with the package registry: the few wheels the store needs
#                                       # (for the GPU machine's python, default 3.12) into build/gpu_wheels,
#                                       # and the tiny model in models/liveloop-tiny
#   bash bench/gpu_check.sh             # there: carry build/gpu_wheels and models/liveloop-tiny along
#   bash bench/gpu_check.sh --cpu       # the same parts, small, on a CPU (checks the script; here:
#                                       # GPU_PYTHON_VERSION=3.11 --prepare, then PYTHON=.venv/bin/python)
#
# No pip install there: the wheels are unpacked into a private directory and the package is mapped the way
# pyproject.toml maps it (liveloop.<component> -> the top-level folder), through symlinks.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
WHEELS=$ROOT/build/gpu_wheels

if [ "${1:-}" = "--prepare" ]; then
  PYV=${GPU_PYTHON_VERSION:-3.12}
  mkdir -p "$WHEELS"
  "$ROOT/.venv/bin/python" -m pip download -q --only-binary=:all: --no-deps --python-version "$PYV" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$WHEELS" \
    "sqlalchemy>=2.0,<2.2" "alembic>=1.13" mako markupsafe
  "$ROOT/.venv/bin/python" -c "import sys; sys.path.insert(0, 'bench'); from common import default_model; print(default_model())"
  du -sh "$WHEELS" models/liveloop-tiny
  exit 0
fi

PY=${PYTHON:-python3}
SITE=$(mktemp -d)
trap 'rm -rf "$SITE"' EXIT
for wheel in "$WHEELS"/*.whl; do
  [ -e "$wheel" ] || { echo "no wheels in $WHEELS: run 'bash bench/gpu_check.sh --prepare' first" >&2; exit 2; }
  "$PY" -m zipfile -e "$wheel" "$SITE"
done
mkdir -p "$SITE/liveloop"
for entry in "$ROOT"/liveloop/*; do ln -s "$entry" "$SITE/liveloop/"; done
for component in server store learner critic clients diffusion monitor experiments rl; do
  ln -s "$ROOT/$component" "$SITE/liveloop/$component"
done
export PYTHONPATH=$SITE
"$PY" bench/gpu_check.py "$@"
