"""One process of the Dynamo cache tests (`test_dynamo_cache.py`): a small model from
`<module dir>/tiny_model.py`, compiled with `torch.compile(backend="tpu")`, one forward and
backward per batch size, checked against the same model on CPU. Prints one JSON line."""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--module-dir", required=True)
    parser.add_argument("--batches", default="4", help="batch sizes, one step each, in order")
    parser.add_argument("--act", default="silu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--options", default="", help="torch.compile options as JSON")
    args = parser.parse_args()
    sys.path.insert(0, args.module_dir)
    os.environ.setdefault("TPU_DYNAMO_CACHE", "on")

    import torch
    import torch.nn.functional as F
    from tiny_model import TinyModel
    from torch._dynamo.utils import counters

    import tpu_backend  # noqa: F401 - the device
    import tpu_backend.compile  # noqa: F401 - the backend (and the Dynamo cache, from the environment)
    from tpu_backend.compile import dynamo_cache

    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    reference = TinyModel(getattr(F, args.act)).to(dtype)
    model = copy.deepcopy(reference).to("tpu")
    options = json.loads(args.options) if args.options else None
    start = time.perf_counter()
    compiled = torch.compile(model, backend="tpu", options=options)
    compile_call = time.perf_counter() - start
    steps = []
    for batch in map(int, args.batches.split(",")):
        x = torch.randn(batch, 16, generator=torch.Generator().manual_seed(batch)).to(dtype)
        start = time.perf_counter()
        loss = compiled(x.to("tpu")).square().mean()
        loss.backward()
        grads = {name: p.grad.to("cpu") for name, p in model.named_parameters()}
        seconds = time.perf_counter() - start
        expected = reference(x).square().mean()
        expected.backward()
        error = max(
            [abs(loss.item() - expected.item())]
            + [(grads[name] - p.grad).abs().max().item() for name, p in reference.named_parameters()]
        )
        for p in (*model.parameters(), *reference.parameters()):
            p.grad = None
        steps.append({"batch": batch, "loss": loss.item(), "error": error, "seconds": seconds})
    print(
        json.dumps(
            {
                "steps": steps,
                "compile_call_s": compile_call,
                "frames_traced": counters["stats"]["unique_graphs"],  # graphs Dynamo traced
                "dynamo_cache": dynamo_cache.counters(),
            }
        )
    )


if __name__ == "__main__":
    main()
