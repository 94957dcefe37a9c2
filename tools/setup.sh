#!/usr/bin/env bash
# Create .venv with pinned dependencies (constraints.txt) and install this project in it, editable.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -c constraints.txt -e '.[dev]'
echo "setup: .venv ready ($(.venv/bin/python -c 'import torch, jax; print("torch", torch.__version__, "jax", jax.__version__)'))"
