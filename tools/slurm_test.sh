#!/usr/bin/env bash
# Testing on a Slurm cluster (one task per GPU):
#   tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [test.py args...]
# Env: GPUS (4), GPUS_PER_NODE (min(GPUS, 4)), CPUS_PER_TASK (5), SRUN_ARGS (""),
#      PYTHON (the repo's .venv/bin/python if present, else python).
set -euo pipefail
if [[ $# -lt 4 ]]; then
  echo "usage: $0 PARTITION JOB_NAME CONFIG CHECKPOINT [test.py args...]" >&2; exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
CHECKPOINT=$4
GPUS=${GPUS:-4}
GPUS_PER_NODE=${GPUS_PER_NODE:-$(( GPUS < 4 ? GPUS : 4 ))}
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
    "$PYTHON" -u "$ROOT/tools/test.py" "$CONFIG" "$CHECKPOINT" --launcher=slurm "${@:5}"
