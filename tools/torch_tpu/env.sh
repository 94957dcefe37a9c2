# source .tpu-wheels/ts/env.sh (on the TPU host, from the project root, after .tpu-wheels/s/env.sh):
# install the staged TorchTPU parts into /tmp/torch_tpu_site once, and export TORCH_TPU_SITE.
# Not on PYTHONPATH: the processes that run TorchTPU add it themselves (see prepare.sh).
if [ ! -d /tmp/torch_tpu_site/torch_tpu ]; then
  if ! ls /tmp/torch-tpu-wheels/tpart* >/dev/null 2>&1; then
    echo "torch_tpu env.sh: no staged parts in /tmp/torch-tpu-wheels (a fresh host): send every part again" >&2; return 1
  fi
  rm -rf /tmp/torch-tpu-wheels/x && mkdir -p /tmp/torch-tpu-wheels/x
  if ! cat /tmp/torch-tpu-wheels/tpart* | tar -C /tmp/torch-tpu-wheels/x -xf - 2>/dev/null \
     || ! (cd /tmp/torch-tpu-wheels/x/tw && sha256sum -c --quiet SHA256SUMS); then
    echo "torch_tpu env.sh: the staged parts are incomplete ($(ls /tmp/torch-tpu-wheels | grep -c tpart) staged): send the missing ones" >&2
    return 1
  fi
  PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile \
    --no-cache-dir --target /tmp/torch_tpu_site /tmp/torch-tpu-wheels/x/tw/*.whl || return 1
  echo "torch_tpu env.sh: TorchTPU installed in /tmp/torch_tpu_site"
fi
export TORCH_TPU_SITE=/tmp/torch_tpu_site
