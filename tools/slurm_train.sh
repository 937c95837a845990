#!/usr/bin/env bash
# Training on a Slurm cluster (one task per GPU):
#   tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [train.py args...]
# Env: GPUS (8), GPUS_PER_NODE (min(GPUS, 8)), CPUS_PER_TASK (5), SRUN_ARGS (""),
#      PYTHON (the repo's .venv/bin/python if present, else python).
set -euo pipefail
if [[ $# -lt 4 ]]; then
  echo "usage: $0 PARTITION JOB_NAME CONFIG WORK_DIR [train.py args...]" >&2; exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-$(( GPUS < 8 ? GPUS : 8 ))}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SRUN_ARGS=${SRUN_ARGS:-""}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if [[ -z ${PYTHON:-} ]]; then
  if [[ -x $ROOT/.venv/bin/python ]]; then PYTHON=$ROOT/.venv/bin/python; else PYTHON=python; fi
fi

set -x
# shellcheck disable=SC2086  # SRUN_ARGS is a list of options
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" \
srun -p "$PARTITION" \
    --job-name="$JOB_NAME" \
    --gres=gpu:"$GPUS_PER_NODE" \
    --ntasks="$GPUS" \
    --ntasks-per-node="$GPUS_PER_NODE" \
    --cpus-per-task="$CPUS_PER_TASK" \
    --kill-on-bad-exit=1 \
    ${SRUN_ARGS} \
    "$PYTHON" -u "$ROOT/tools/train.py" "$CONFIG" --work-dir="$WORK_DIR" --launcher=slurm "${@:5}"
