#!/usr/bin/env bash
# On the TPU host: keep the TorchTPU parts that came with this command in /tmp/torch-tpu-wheels
# (which lasts while the host stays up). Parts may come over several commands, in any order.
mkdir -p /tmp/torch-tpu-wheels
for f in .tpu-wheels/t[0-9]*/tpart*; do [ -f "$f" ] && cp "$f" /tmp/torch-tpu-wheels/; done
echo "staged: $(cd /tmp/torch-tpu-wheels && ls | tr '\n' ' ')"
