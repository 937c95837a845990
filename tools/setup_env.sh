#!/usr/bin/env bash
# Create (or complete) the virtual environment at .venv with the pinned OpenMMLab stack.
#
# Idempotent: every step is skipped when already done, and a finished environment is
# marked by .venv/.paca_mm_env (content = hash of the requirement files), so `make`
# never rebuilds it. mmcv 2.1.0 has no wheel for torch 2.14: it is built once from the
# PyPI sdist (C++20, CPU ops) and kept in a cache outside the repo keyed by the mmcv,
# torch and Python versions ($PACA_MM_CACHE, default ~/.cache/paca_mm).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${VENV:-$ROOT/.venv}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
CACHE=${PACA_MM_CACHE:-$HOME/.cache/paca_mm}
MMCV_VERSION=2.1.0
TORCH_VERSION=$(sed -n 's/^torch==//p' requirements/torch.txt)
STAMP=$VENV/.paca_mm_env
WANT=$(cat requirements/*.txt setup.py tools/setup_env.sh paca_mm/ops/csrc/* 2>/dev/null \
  | sha256sum | cut -c1-16)

log() { echo "[setup_env] $*"; }

if [[ -f $STAMP && $(cat "$STAMP") == "$WANT" ]]; then
  log "environment up to date ($VENV)"; exit 0
fi

[[ -x $VENV/bin/python ]] || { log "creating $VENV"; "$PY" -m venv "$VENV"; }
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q -r requirements/build.txt
"${PIP[@]}" install -q -r requirements/torch.txt "numpy<2"

PYTAG=$("$VENV/bin/python" -c 'import sys;print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
WHEELDIR=$CACHE/wheels/mmcv-$MMCV_VERSION-torch-$TORCH_VERSION-$PYTAG-$(uname -m)
if ! "$VENV/bin/python" -c "import mmcv, mmcv.ops" 2>/dev/null; then
  if ! ls "$WHEELDIR"/mmcv-*.whl >/dev/null 2>&1; then
    log "building mmcv $MMCV_VERSION with CPU ops for torch $TORCH_VERSION (about 25 min on 2 cores)"
    BUILD=$(mktemp -d)
    "${PIP[@]}" download -q --no-deps --no-binary :all: --no-build-isolation \
      -d "$BUILD" "mmcv==$MMCV_VERSION"
    tar -xzf "$BUILD"/mmcv-$MMCV_VERSION.tar.gz -C "$BUILD"
    SRC=$BUILD/mmcv-$MMCV_VERSION
    # torch >= 2.10 headers require C++20; mmcv 2.1.0 hard-codes -std=c++17.
    sed -i 's/-std=c++17/-std=c++20/g' "$SRC/setup.py"
    grep -q -- '-std=c++20' "$SRC/setup.py" || { log "could not patch the C++ standard in mmcv's setup.py"; exit 1; }
    mkdir -p "$WHEELDIR"
    (cd "$SRC" && MMCV_WITH_OPS=1 FORCE_CUDA=0 MAX_JOBS=${MAX_JOBS:-$(nproc)} \
      "${PIP[@]}" wheel --no-cache-dir --no-build-isolation --no-deps -w "$BUILD/dist" .)
    mv "$BUILD"/dist/mmcv-*.whl "$WHEELDIR"/
    rm -rf "$BUILD"
  fi
  log "installing cached mmcv wheel from $WHEELDIR"
  "${PIP[@]}" install -q --no-deps "$WHEELDIR"/mmcv-*.whl
fi

"${PIP[@]}" install -q -r requirements/mmcv.txt -r requirements/runtime.txt -r requirements/tests.txt \
  -c requirements/torch.txt
"${PIP[@]}" install -q --no-build-isolation --no-deps -e .
# The compiled CPU ops (paca_mm/ops/csrc) next to the sources: an editable install does not
# keep them. About a minute; they need the venv's torch, hence no build isolation.
log "building paca_mm's CPU ops (paca_mm/_ops*.so)"
if ! "$VENV/bin/python" setup.py build_ext --inplace --force >"$VENV/paca_mm_ops_build.log" 2>&1; then
  tail -n 40 "$VENV/paca_mm_ops_build.log"
  log "building the CPU ops failed (log: $VENV/paca_mm_ops_build.log)"; exit 1
fi
"$VENV/bin/python" -c "import paca_mm.ops as o; ok, why = o.status(); print('paca_mm CPU ops:', why); raise SystemExit(0 if ok else 1)"
"$VENV/bin/python" -c "import mmcv.ops, mmdet, mmseg, mmpretrain, paca_mm; print('paca_mm', paca_mm.__version__, 'mmcv', mmcv.__version__)"
echo "$WANT" > "$STAMP"
log "done"
