#!/usr/bin/env bash
# Runs every test that asserts a learning outcome (`pytest -m learning`) on several builds of the default
# model (`[model] seed` N in models/liveloop-tiny-seedN, built here the first time, ~3 minutes each; seed
# 0 is models/liveloop-tiny) and on both CPU kernel paths torch has on this machine (its best, and
# ATEN_CPU_CAPABILITY=default: no vector kernels), one pytest run per (kernel path, build), then a table
# of the verdicts. A learning verdict must not depend on which build or kernels a machine happens to
# have (docs/design.md, "Reproducible verdicts"). Not part of .ci/run (10-20 minutes a pass); run it
# after changing the learner or a learning test.
#   bash scripts/learning_matrix.sh                  # seeds 0 1 2, kernel paths "best default"
#   SEEDS="1" KERNELS="best" bash scripts/learning_matrix.sh -x    # extra arguments go to pytest
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
LOGS=${LOGS:-test-artifacts/learning-matrix}
mkdir -p "$LOGS"
rows=()
for kernels in ${KERNELS:-best default}; do
  for seed in ${SEEDS:-0 1 2}; do
    out=models/liveloop-tiny-seed$seed
    [ "$seed" = 0 ] && out=models/liveloop-tiny  # [model] seed 0 is the default build
    .venv/bin/liveloop model init --seed "$seed" --out "$out" >/dev/null || exit 1
    log="$LOGS/seed$seed-$kernels.log"
    if [ "$kernels" = best ]; then unset ATEN_CPU_CAPABILITY; else export ATEN_CPU_CAPABILITY=$kernels; fi
    LIVELOOP_TEST_MODEL_SEED=$seed .venv/bin/python -m pytest -p no:cacheprovider -m learning -q -rA "$@" tests >"$log" 2>&1
    rows+=("| $seed | $kernels | $(tail -n 1 "$log" | tr -d '=') |")
  done
done
unset ATEN_CPU_CAPABILITY
echo "| model seed | kernels | pytest -m learning |"
echo "|---|---|---|"
printf '%s\n' "${rows[@]}"
! grep -q -E "[0-9]+ (failed|error)" "$LOGS"/*.log
