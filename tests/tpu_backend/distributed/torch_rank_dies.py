"""A torch.distributed ("tpu") run in which rank 1 fails; for the launcher tests.

    python -m torch.distributed.run --nproc_per_node 2 torch_rank_dies.py exit   # rank 1 exits with code 7
    python -m torch.distributed.run --nproc_per_node 2 torch_rank_dies.py stall  # rank 1 stops answering

After one all_reduce that every rank completes, rank 1 exits (code 7) or sleeps, and
rank 0 enters a second all_reduce that can never complete. With `exit` the launcher must
name rank 1 and its exit code and stop rank 0; with `stall` rank 0's collective
outlives the group's timeout (TIMEOUT_S, given to init_process_group) and the
process group's watchdog ends rank 0.
"""

from __future__ import annotations

import datetime
import os
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import tpu_backend  # noqa: E402,F401

TIMEOUT_S = 20
EXIT_CODE = 7

dist.init_process_group("tpu", timeout=datetime.timedelta(seconds=TIMEOUT_S))
rank = dist.get_rank()
x = torch.ones(4, device="tpu")
dist.all_reduce(x)
print(f"rank {rank}: first all_reduce {x.sum().item():g}", flush=True)
if rank == 1:
    if sys.argv[1] == "exit":
        os._exit(EXIT_CODE)
    time.sleep(600)
dist.all_reduce(x)  # never completes: rank 1 is gone or silent
print(f"rank {rank}: second all_reduce returned (unexpected)", flush=True)
