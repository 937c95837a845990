#!/usr/bin/env bash
# Build an mmcv wheel with its compiled ops from the sdist, against the torch of PYTHON.
#
#   dev/build_mmcv.sh PYTHON OUT_DIR cpu|cuda [SDIST]
#
# Without SDIST, mmcv==$MMCV_VERSION (default 2.1.0) is downloaded from the package index.
# cpu: CPU ops only; CUDA is hidden from torch during the build, since mmcv's setup.py builds
# CUDA ops whenever torch sees a GPU. cuda: FORCE_CUDA=1 (needs nvcc; TORCH_CUDA_ARCH_LIST
# selects the GPU architectures). torch >= 2.10 headers require C++20 while mmcv 2.1.0
# hard-codes -std=c++17 (for g++ and nvcc): its setup.py is patched then. MAX_JOBS (default:
# all cores) sets the parallel compile jobs. Used by dev/setup_env.sh and dev/gpu_check.sh.
set -euo pipefail
[[ $# -ge 3 && ($3 == cpu || $3 == cuda) ]] || {
  echo "usage: $0 PYTHON OUT_DIR cpu|cuda [SDIST]" >&2; exit 2; }
PY=$1 OUT=$2 DEVICE=$3 SDIST=${4:-}
MMCV_VERSION=${MMCV_VERSION:-2.1.0}
log() { echo "[build_mmcv] $*"; }

BUILD=$(mktemp -d)
trap 'rm -rf "$BUILD"' EXIT
if [[ -z $SDIST ]]; then
  "$PY" -m pip --disable-pip-version-check download -q --no-deps --no-binary :all: \
    --no-build-isolation -d "$BUILD" "mmcv==$MMCV_VERSION"
  SDIST=$BUILD/mmcv-$MMCV_VERSION.tar.gz
fi
tar -xzf "$SDIST" -C "$BUILD"
SRC=$(find "$BUILD" -mindepth 2 -maxdepth 2 -name setup.py -path '*/mmcv-*' -printf '%h\n' | head -n1)
[[ -n $SRC ]] || { log "no mmcv source tree in $SDIST"; exit 1; }

if "$PY" -c 'import sys, torch; v = torch.__version__.split("+")[0].split(".")
sys.exit(0 if (int(v[0]), int(v[1])) >= (2, 10) else 1)'; then
  sed -i 's/-std=c++17/-std=c++20/g' "$SRC/setup.py"
  grep -q -- '-std=c++20' "$SRC/setup.py" || { log "could not patch the C++ standard in $SRC/setup.py"; exit 1; }
  log "patched mmcv's setup.py to C++20 (torch >= 2.10)"
fi
if [[ $DEVICE == cuda ]]; then
  BUILD_ENV=(FORCE_CUDA=1)
else
  BUILD_ENV=(FORCE_CUDA=0 CUDA_VISIBLE_DEVICES=)
fi
mkdir -p "$OUT"
(cd "$SRC" && env "${BUILD_ENV[@]}" MMCV_WITH_OPS=1 MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
  "$PY" -m pip --disable-pip-version-check wheel --no-cache-dir --no-build-isolation --no-deps \
  -w "$BUILD/dist" .)
mv "$BUILD"/dist/mmcv-*.whl "$OUT"/
log "built $(basename "$OUT"/mmcv-*.whl) ($DEVICE ops) in $OUT"
