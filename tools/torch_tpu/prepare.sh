#!/usr/bin/env bash
# Stage TorchTPU (torch-tpu 0.2.0) for a TPU host that has JAX + libtpu but no package index.
# Run from the project root on a machine with pip access, after ../shared/tpu-vm/prepare.sh
# (which brings torch 2.13.0, the torch TorchTPU runs on):
#     bash tools/torch_tpu/prepare.sh
# It writes (git-ignored, beside the torch parts of .tpu-wheels/p*):
#     .tpu-wheels/t0 .. tN   one part each (<= 56 MB) of a tar of torch-tpu, its own libtpu
#                            (TorchTPU asks for libtpu >= 0.0.50; the host's JAX keeps its own)
#                            and the dependencies the torch parts do not bring
#     .tpu-wheels/ts         stage.sh and env.sh (below)
# On the TPU host, from the project root, one quick command per part (carry .tpu-wheels/tK and
# .tpu-wheels/ts):  bash .tpu-wheels/ts/stage.sh
# then:             source .tpu-wheels/s/env.sh && source .tpu-wheels/ts/env.sh && \
#                   python3 -m benchmarks.anchors.torch_tpu_vs_ours
# env.sh installs them into /tmp/torch_tpu_site and exports TORCH_TPU_SITE; it does NOT put that
# folder on PYTHONPATH: TorchTPU loads itself into every `import torch` that can see it (its
# torch.backends entry point) and names its device "tpu" as this project does, so only the
# processes meant to run TorchTPU get it (benchmarks/anchors/torch_tpu_vs_ours.py).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TORCH_TPU=0.2.0
LIBTPU=0.0.52
grep -qx '/.tpu-wheels/' .git/info/exclude 2>/dev/null || echo '/.tpu-wheels/' >> .git/info/exclude
rm -rf .tpu-wheels/t[0-9]* .tpu-wheels/ts .tpu-wheels/tw && mkdir -p .tpu-wheels/tw .tpu-wheels/ts
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
  --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any -d .tpu-wheels/tw \
  "torch-tpu==$TORCH_TPU" "libtpu==$LIBTPU" absl-py portpicker frozendict immutabledict pyzmq psutil \
  tensorboard tensorboard-data-server grpcio markdown werkzeug markupsafe 2>&1 | grep -v '^WARNING: Location' || true
ls .tpu-wheels/tw/torch_tpu-"$TORCH_TPU"-*.whl .tpu-wheels/tw/libtpu-"$LIBTPU"-*.whl >/dev/null
(cd .tpu-wheels/tw && sha256sum -- *.whl > SHA256SUMS)
tar -C .tpu-wheels -cf - tw | split -b 56000000 -d -a 1 - .tpu-wheels/tpart
for f in .tpu-wheels/tpart*; do n="${f##*tpart}"; mkdir -p ".tpu-wheels/t$n"; mv "$f" ".tpu-wheels/t$n/tpart$n"; done
rm -rf .tpu-wheels/tw
cp "$here/stage.sh" "$here/env.sh" .tpu-wheels/ts/
echo "parts: $(ls -d .tpu-wheels/t[0-9]* | tr '\n' ' ')"
du -sh .tpu-wheels/t[0-9]*
