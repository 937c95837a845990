#!/usr/bin/env bash
# Create (or complete) a virtual environment with one of the two tested OpenMMLab stacks.
#
#   STACK=main   (default) .venv, Python 3.11, torch 2.14.1   (requirements/stack_main.txt)
#   STACK=compat           .venv-compat, Python 3.8, torch 2.1.2, the classic GPU stack
#                          (requirements/stack_compat.txt)
#   CUDA=auto    (default) build mmcv's CUDA ops when nvcc is on PATH, torch is a CUDA build
#                and sees a GPU; CUDA=1 also without a GPU (a login node: set
#                TORCH_CUDA_ARCH_LIST then), CUDA=0 builds CPU ops only.
#   VENV, PYTHON           override the environment's path and the interpreter that creates it.
#
# Idempotent: every step is skipped when already done, and a finished environment is marked
# by $VENV/.paca_mm_env (content = hash of the stack, the CUDA choice and the requirement
# files), so `make` never rebuilds it. mmcv 2.1.0 is built once from the PyPI sdist with its
# ops (dev/build_mmcv.sh; C++20 for torch >= 2.10) and kept in a cache outside the repo,
# keyed by the mmcv, torch, CUDA (cuXYZ or cpu) and Python versions ($PACA_MM_CACHE, default
# ~/.cache/paca_mm).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
STACK=${STACK:-main}
CUDA=${CUDA:-auto}
CACHE=${PACA_MM_CACHE:-$HOME/.cache/paca_mm}
MMCV_VERSION=2.1.0

log() { echo "[setup_env] $*"; }
die() { log "error: $*"; exit 1; }

case $STACK in
  main) DEFAULT_VENV=$ROOT/.venv; PYVER=3.11 ;;
  compat) DEFAULT_VENV=$ROOT/.venv-compat; PYVER=3.8 ;;
  *) die "unknown STACK='$STACK' (use STACK=main or STACK=compat)" ;;
esac
case $CUDA in
  auto | 0 | 1) ;;
  *) die "unknown CUDA='$CUDA' (use CUDA=auto, CUDA=1 or CUDA=0)" ;;
esac
PINS=requirements/stack_$STACK.txt
VENV=${VENV:-$DEFAULT_VENV}
[[ $VENV == /* ]] || VENV=$ROOT/$VENV
STAMP=$VENV/.paca_mm_env
WANT=$( (echo "$STACK $CUDA"; cat requirements/*.txt setup.py dev/setup_env.sh) \
  | sha256sum | cut -c1-16)

if [[ -f $STAMP && $(cat "$STAMP") == "$WANT" ]]; then
  log "environment up to date ($VENV)"; exit 0
fi

# The interpreter: $PYTHON, else pythonX.Y on PATH, else pyenv's X.Y (a pyenv shim for a
# version that is installed but not selected exists on PATH yet fails, hence the test run).
find_python() {
  local candidate
  for candidate in ${PYTHON:-} "python$PYVER" "$(pyenv root 2>/dev/null)"/versions/"$PYVER".*/bin/"python$PYVER"; do
    if [[ -n $candidate ]] && "$candidate" -c 'import sys' >/dev/null 2>&1; then
      echo "$candidate"; return 0
    fi
  done
  return 1
}
if [[ ! -x $VENV/bin/python ]]; then
  PY=$(find_python) || die "no Python $PYVER found for STACK=$STACK (set PYTHON=/path/to/python$PYVER)"
  log "creating $VENV with $("$PY" --version 2>&1)"
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q -r requirements/build.txt
"${PIP[@]}" install -q -c "$PINS" torch torchvision numpy

read -r TORCH_VERSION TORCH_CUDA GPU PYTAG < <("$VENV/bin/python" -c '
import sys, torch
print(torch.__version__.split("+")[0], torch.version.cuda or "none", int(torch.cuda.is_available()),
      "cp%d%d" % sys.version_info[:2])')
[[ -n ${PYTAG:-} ]] || die "could not import torch in $VENV"

WITH_CUDA=0
if [[ $CUDA != 0 ]]; then
  if command -v nvcc >/dev/null && [[ $TORCH_CUDA != none && ($GPU == 1 || $CUDA == 1) ]]; then
    WITH_CUDA=1
  elif [[ $CUDA == 1 ]]; then
    die "CUDA=1 needs nvcc on PATH and a CUDA build of torch (found nvcc: $(command -v nvcc || echo none), torch CUDA: $TORCH_CUDA)"
  fi
fi
if [[ $WITH_CUDA == 1 ]]; then
  NVCC_CUDA=$(nvcc --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1.\2/p')
  [[ ${NVCC_CUDA%%.*} == "${TORCH_CUDA%%.*}" ]] \
    || die "nvcc is CUDA $NVCC_CUDA but torch was built with CUDA $TORCH_CUDA (major versions must match)"
  DEVICE_TAG=cu${NVCC_CUDA/./} OPS=cuda
else
  DEVICE_TAG=cpu OPS=cpu
fi

WHEELDIR=$CACHE/wheels/mmcv-$MMCV_VERSION-torch-$TORCH_VERSION-$DEVICE_TAG-$PYTAG-$(uname -m)
# The installed mmcv's ops: cpu, cuda, or none (no mmcv, or one without compiled ops).
HAVE_OPS=$("$VENV/bin/python" -c "from mmcv.ops import get_compiling_cuda_version as v
print('cpu' if v() == 'not available' else 'cuda')" 2>/dev/null || echo none)
if [[ $HAVE_OPS != "$OPS" ]]; then
  if ! ls "$WHEELDIR"/mmcv-*.whl >/dev/null 2>&1; then
    log "building mmcv $MMCV_VERSION with $DEVICE_TAG ops for torch $TORCH_VERSION (CPU ops: about 25 min on 2 cores)"
    MMCV_VERSION=$MMCV_VERSION bash dev/build_mmcv.sh "$VENV/bin/python" "$WHEELDIR" "$OPS"
  fi
  log "installing cached mmcv wheel from $WHEELDIR (installed mmcv ops: $HAVE_OPS)"
  "${PIP[@]}" install -q --no-deps --force-reinstall "$WHEELDIR"/mmcv-*.whl
fi

REQS=(-r requirements/runtime.txt -r requirements/tests.txt)
[[ -f requirements/deploy.txt ]] && REQS+=(-r requirements/deploy.txt)
"${PIP[@]}" install -q "${REQS[@]}" -c "$PINS"
"${PIP[@]}" install -q --no-build-isolation --no-deps -e .
"$VENV/bin/python" -c "
import mmcv.ops, mmdet, mmseg, mmpretrain, torch, paca_mm
from mmcv.ops import get_compiling_cuda_version
print('paca_mm', paca_mm.__version__, '| torch', torch.__version__, '| mmcv', mmcv.__version__,
      'ops CUDA:', get_compiling_cuda_version())"
echo "$WANT" > "$STAMP"
log "done ($VENV, STACK=$STACK, mmcv ops: $DEVICE_TAG)"
