"""`Trainer` under `accelerate launch`: each process trains on its "tpu" device over the
project's torch.distributed backend "tpu", with DDP (`--multi_gpu`) or FSDP2 through
accelerate's FSDP plugin (`--use_fsdp --fsdp_version 2`). Rank 0 writes the logged
losses and the trained (full) parameters to OUT/ranked.pt.

    accelerate launch --multi_gpu --num_processes 2 trainer_ddp.py OUT
"""

from __future__ import annotations

import os
import sys

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

import tpu_backend  # noqa: F401
from tests.tpu_backend.test_trainer_integration import logged_losses, make_trainer


def main(out: str) -> None:
    trainer = make_trainer(out, use_cpu=False)
    trainer.train()
    state = trainer.accelerator.state
    assert trainer.accelerator.device == torch.device("tpu", 0), trainer.accelerator.device
    assert state.backend == "tpu" and state.num_processes == 2, (state.backend, state.num_processes)
    if os.environ.get("ACCELERATE_USE_FSDP", "false") == "true":
        assert isinstance(trainer.model, FSDPModule), type(trainer.model)
    else:
        assert type(trainer.model_wrapped).__name__ == "DistributedDataParallel", type(trainer.model_wrapped)
    parameters = {  # every rank takes part in gathering a sharded parameter
        name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu().float()
        for name, p in trainer.model.named_parameters()
    }
    if state.process_index == 0:
        assert {p.device.type for p in trainer.model.parameters()} == {"tpu"}
        torch.save({"losses": logged_losses(trainer), "parameters": parameters}, f"{out}/ranked.pt")


if __name__ == "__main__":
    main(sys.argv[1])
