#!/usr/bin/env bash
# Create .venv with pinned dependencies (constraints.txt) and install this project in it, editable.
# --web also installs what the browser runtime needs: Chromium (Debian's package, when it is
# missing and apt-get can run) and the pinned @litertjs/core (npm ci in runtimes/web).
set -euo pipefail
cd "$(dirname "$0")/.."
WEB=0
for arg in "$@"; do
  case "$arg" in
    --web) WEB=1 ;;
    *) echo "usage: tools/setup.sh [--web]" >&2; exit 2 ;;
  esac
done
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -c constraints.txt -e '.[dev]'
# timm without its torchvision dependency (PyPI's torchvision is a CUDA build that cannot load
# against CPU torch, and transformers would then fail to import); `import litert_torch` (or tpu_backend) lets timm import
# without it (common/timm_compat.py).
.venv/bin/python -m pip install -q --no-deps -c constraints.txt timm pyyaml
# libtpu (Linux x86_64 only): compiles programs and Pallas kernels for a TPU chip on this machine,
# without one (kernels.tpu.compile_for, kernels.check_lowering); on a TPU VM it also runs them.
if [ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ]; then
  .venv/bin/python -m pip install -q -c constraints.txt libtpu
fi
# The device's compiled dispatch path (tpu_backend/native: C++ built against this torch, ~30 s).
# Without a compiler the device runs its pure-Python path: the same results, more host time per op.
if ! TPU_NATIVE=0 .venv/bin/python -m tpu_backend.native build >/dev/null; then
  echo "setup: the tpu native extension did not build (see above): the device will use its pure-Python path" >&2
fi
echo "setup: .venv ready ($(.venv/bin/python -c 'import torch, jax; print("torch", torch.__version__, "jax", jax.__version__)'))"
if [ "$WEB" = 1 ]; then
  if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
      echo "setup: no Chromium and no root apt-get: the browser tests will skip (install chromium)" >&2
    fi
  fi
  if command -v npm >/dev/null; then
    (cd runtimes/web && npm ci --no-audit --no-fund --silent)
    echo "setup: web runtime ready (@litertjs/core in runtimes/web/node_modules)"
  else
    echo "setup: npm not found: the browser tests will skip (install Node.js and npm)" >&2
  fi
fi
