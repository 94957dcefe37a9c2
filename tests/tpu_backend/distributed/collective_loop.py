"""A process of a multi-process run that keeps doing small cross-process reductions.

Used by the launcher tests: `python -m tpu_backend.launch --nproc 2 --cpu-devices 4
tests/tpu_backend/distributed/collective_loop.py STEPS`. Every process prints
`step i: <sum>` after each reduction over the whole mesh (a value that needs every
process's data), so a test can wait for progress, kill one process and watch the rest.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

import torch  # noqa: E402

import tpu_backend.distributed as dist  # noqa: E402  (joins the launcher's run)

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
mesh = dist.init_mesh((-1,), ("data",))
rows = 2 * len(mesh.local_devices)
local = torch.full((rows, 4), float(dist.process_index() + 1))
x = dist.shard_batch(local, mesh)  # global: every process's rows
for step in range(steps):
    total = (x * step).sum().item()
    print(f"step {step}: {total:g}", flush=True)
    time.sleep(0.2)
