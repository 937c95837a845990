#!/usr/bin/env bash
# Multi-process testing on one or more nodes with torchrun:
#   tools/dist_test.sh CONFIG CHECKPOINT GPUS [test.py args...]
# Env: NNODES (1), NODE_RANK (0), PORT (29500), MASTER_ADDR (127.0.0.1),
#      PYTHON (the repo's .venv/bin/python if present, else python).
# GPUS is the number of processes per node; without CUDA they are CPU processes (gloo).
set -euo pipefail
if [[ $# -lt 3 ]]; then
  echo "usage: $0 CONFIG CHECKPOINT GPUS [test.py args...]" >&2; exit 2
fi
CONFIG=$1
CHECKPOINT=$2
GPUS=$3
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if [[ -z ${PYTHON:-} ]]; then
  if [[ -x $ROOT/.venv/bin/python ]]; then PYTHON=$ROOT/.venv/bin/python; else PYTHON=python; fi
fi

PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" \
"$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" \
    --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$GPUS" \
    --master_port="$PORT" \
    "$ROOT/tools/test.py" \
    "$CONFIG" \
    "$CHECKPOINT" \
    --launcher pytorch "${@:4}"
