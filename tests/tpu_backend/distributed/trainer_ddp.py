"""`Trainer` under `accelerate launch`: each process trains on its "tpu" device, DDP over
the project's torch.distributed backend "tpu". Rank 0 writes the logged losses and the
trained parameters to OUT/ranked.pt.

    accelerate launch --multi_gpu --num_processes 2 trainer_ddp.py OUT [--fsdp]
"""

from __future__ import annotations

import sys

import torch

import tpu_backend  # noqa: F401
from tests.tpu_backend.test_trainer_integration import cpu_parameters, logged_losses, make_trainer


def main(out: str) -> None:
    trainer = make_trainer(out, use_cpu=False)
    trainer.train()
    state = trainer.accelerator.state
    assert trainer.accelerator.device == torch.device("tpu", 0), trainer.accelerator.device
    assert state.backend == "tpu" and state.num_processes == 2, (state.backend, state.num_processes)
    assert type(trainer.model_wrapped).__name__ == "DistributedDataParallel", type(trainer.model_wrapped)
    if state.process_index == 0:
        report = {"losses": logged_losses(trainer), "parameters": cpu_parameters(trainer.model)}
        torch.save(report, f"{out}/ranked.pt")


if __name__ == "__main__":
    main(sys.argv[1])
