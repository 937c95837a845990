#!/usr/bin/env bash
# The prepared GPU check: dev/benchmark.py (PaCa-T/S vs PVTv2-B2 and Swin-T, with and
# without AMP: forward, forward+backward, peak forward memory at 512^2 and 800x1280), the
# whole-model benchmark dev/zoo_benchmark.py (fp32 and AMP) and a few AMP training iterations
# of demo/configs/pacahead_tiny_synthetic_seg.py through tools/train.py, summarised in one Markdown table (dev/gpu_check.py does the runs).
#
#   dev/gpu_check.sh [--device cuda|cpu] [--out DIR] [--wheels DIR]
#       Run the check (default: --device cuda --out work_dirs/gpu_check). --device cpu is the
#       dry run CI does (64^2 inputs, one repetition, one training iteration).
#   dev/gpu_check.sh --probe
#       Print what the machine has (Python, torch, CUDA, nvcc, `pip list`, the imports the
#       check needs): seconds, to decide what to carry.
#   dev/gpu_check.sh --prepare-wheels DIR [--have PIP_FREEZE_FILE]
#       Fill DIR with what an offline Python 3.12 x86_64 machine needs (the mmcv sdist, wheels
#       of mmengine, mmdet, mmseg and their dependencies, without those listed in the
#       `pip list --format=freeze` output PIP_FREEZE_FILE) and fail if it exceeds 64 MiB.
#
# On the GPU machine (no network): python3 there must have torch with CUDA. If mmcv (with ops)
# mmengine, mmdet or mmseg are not importable, the check makes a virtual environment under
# --out that sees the system packages, installs the carried wheels into it (--no-index
# --no-deps) and, if no mmcv wheel is carried, builds mmcv 2.1.0 from the carried sdist with
# CPU ops (dev/build_mmcv.sh; the benchmark and the demo training use no mmcv CUDA op).
# The built wheel is left in --out/wheels for the next run to carry. PYTHON picks the
# interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
MODE=run DEVICE=cuda OUT=work_dirs/gpu_check WHEELS='' HAVE=''
# Everything the check imports beyond torch: distribution==version (pure Python or cp312).
CARRY=(setuptools==80.9.0 wheel==0.45.1 ninja==1.13.0
  mmengine==0.10.7 mmdet==3.3.0 mmsegmentation==1.2.2
  addict==2.4.0 yapf==0.43.0 platformdirs==4.3.8 termcolor==3.1.0 rich==14.0.0
  markdown-it-py==3.0.0 mdurl==0.1.2 pygments==2.19.2 pyyaml==6.0.2 packaging==25.0
  numpy==1.26.4 pillow==11.3.0 opencv-python-headless==4.11.0.86
  matplotlib==3.10.3 contourpy==1.3.2 cycler==0.12.1 fonttools==4.58.5 kiwisolver==1.4.8
  pyparsing==3.2.3 python-dateutil==2.9.0.post0 six==1.17.0
  pycocotools==2.0.10 shapely==2.1.1 terminaltables==3.1.10 tqdm==4.67.1 scipy==1.15.3
  prettytable==3.16.0 wcwidth==0.2.13 ftfy==6.3.1 regex==2024.11.6)
CARRY_LIMIT=$((64 << 20))

log() { echo "[gpu_check] $*"; }
die() { log "error: $*"; exit 1; }

while [[ $# -gt 0 ]]; do
  case $1 in
    --device) DEVICE=${2:?--device needs cuda or cpu}; shift 2 ;;
    --out) OUT=${2:?--out needs a folder}; shift 2 ;;
    --wheels) WHEELS=${2:?--wheels needs a folder}; shift 2 ;;
    --probe) MODE=probe; shift ;;
    --prepare-wheels) MODE=prepare; WHEELS=${2:?--prepare-wheels needs a folder}; shift 2 ;;
    --have) HAVE=${2:?--have needs a pip freeze file}; shift 2 ;;
    -h | --help) sed -n '2,26p' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ $DEVICE == cuda || $DEVICE == cpu ]] || die "--device must be cuda or cpu, got '$DEVICE'"

IMPORTS='import mmcv.ops, mmengine, mmdet.models, mmseg.models'

if [[ $MODE == probe ]]; then
  "$PY" --version
  "$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda,
"available", torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else "")' || true
  command -v nvcc >/dev/null && nvcc --version | tail -n 2 || echo "nvcc: not on PATH"
  echo "cores: $(nproc)"
  "$PY" -m pip list --format=freeze 2>/dev/null || echo "pip: not available"
  for module in mmcv.ops mmengine mmdet.models mmseg.models cv2 matplotlib scipy shapely pycocotools; do
    "$PY" -c "import $module" >/dev/null 2>&1 && echo "import $module: ok" || echo "import $module: MISSING"
  done
  exit 0
fi

if [[ $MODE == prepare ]]; then
  mkdir -p "$WHEELS"
  WANT=()
  for req in "${CARRY[@]}"; do
    name=${req%%==*}
    if [[ -n $HAVE ]] && grep -qi "^${name//[-_]/[-_]}==" "$HAVE"; then
      log "skipping $name (in $HAVE)"
    else
      WANT+=("$req")
    fi
  done
  "$PY" -m pip --disable-pip-version-check download -q --no-deps --only-binary :all: \
    --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d "$WHEELS" "${WANT[@]}"
  "$PY" -m pip --disable-pip-version-check download -q --no-deps --no-binary :all: \
    --no-build-isolation -d "$WHEELS" mmcv==2.1.0
  total=$(du -cb "$WHEELS"/* | tail -n 1 | cut -f1)
  du -h "$WHEELS"/* | sort -h | tail -n 8
  log "$WHEELS: $((total >> 20)) MiB in $(ls "$WHEELS" | wc -l) files (limit 64 MiB)"
  [[ $total -le $CARRY_LIMIT ]] || die "over the 64 MiB carry limit: probe the machine (--probe) and pass its pip list as --have"
  exit 0
fi

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
if ! "$PY" -c "$IMPORTS" >/dev/null 2>&1; then
  [[ -n $WHEELS ]] || die "$PY cannot run '$IMPORTS' and no --wheels folder was given (prepare one with --prepare-wheels)"
  WHEELS=$(cd "$WHEELS" && pwd)
  VENV=$OUT/venv
  [[ -x $VENV/bin/python ]] || "$PY" -m venv --system-site-packages "$VENV"
  PY=$VENV/bin/python
  log "installing the carried wheels into $VENV"
  "$PY" -m pip --disable-pip-version-check install -q --no-index --no-deps "$WHEELS"/*.whl
  if ! "$PY" -c 'import mmcv.ops' >/dev/null 2>&1; then
    SDIST=$(ls "$WHEELS"/mmcv-*.tar.gz 2>/dev/null | head -n 1)
    [[ -n $SDIST ]] || die "no mmcv wheel or sdist in $WHEELS"
    start=$SECONDS
    bash dev/build_mmcv.sh "$PY" "$OUT/wheels" cpu "$SDIST"
    log "mmcv built in $((SECONDS - start)) s"
    "$PY" -m pip --disable-pip-version-check install -q --no-index --no-deps "$OUT"/wheels/mmcv-*.whl
  fi
  "$PY" -c "$IMPORTS" || die "'$IMPORTS' still fails after installing the carried wheels"
fi
PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} exec "$PY" dev/gpu_check.py --device "$DEVICE" --out "$OUT"
