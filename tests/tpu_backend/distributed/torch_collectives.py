"""Every collective of the "tpu" torch.distributed backend against gloo, in one launch.

Run by `test_process_group.py` as `python -m torch.distributed.run --nproc_per_node N
tests/tpu_backend/distributed/torch_collectives.py OUT_DIR [BACKEND]`. The default group is "tpu";
a gloo group over the same ranks gets the same inputs as CPU tensors. Each rank writes
`OUT_DIR/rank<r>.json`: the name of every case it checked (results must be equal: the
inputs are small integers, so every reduction order gives the same floats) and any
mismatch.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._functional_collectives as funcol  # noqa: E402

import tpu_backend  # noqa: E402,F401  (registers the "tpu" backend)

# argv[2]: the backend as the user names it: "tpu" (default), "cpu:gloo,tpu:tpu", or "none"
# (no backend: "tpu" is registered as the default for tpu tensors)
SPEC = sys.argv[2] if len(sys.argv) > 2 else "tpu"
dist.init_process_group(None if SPEC == "none" else SPEC)
RANK, SIZE = dist.get_rank(), dist.get_world_size()
GLOO = dist.new_group(backend="gloo")
checked: list[str] = []
mismatches: list[str] = []


def inputs(shape, dtype, salt: int = 0) -> torch.Tensor:
    """Small integers (exact in every dtype and every summation order), different per rank."""
    g = torch.Generator().manual_seed(1000 * RANK + salt)
    values = torch.randint(-4, 5, shape, generator=g)
    if dtype == torch.bool:
        return values > 0
    return values.to(dtype)


def _rank_inputs(rank: int, shape, salt: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + salt)
    return torch.randint(-4, 5, shape, generator=g).float()


def check(name: str, got, want) -> None:
    checked.append(name)
    got = [got] if isinstance(got, torch.Tensor) else got
    want = [want] if isinstance(want, torch.Tensor) else want
    for g, w in zip(got, want, strict=True):
        g = g.cpu()
        if g.dtype != w.dtype or g.shape != w.shape or not torch.equal(g, w):
            mismatches.append(
                f"{name}: tpu {g.dtype} {tuple(g.shape)} {g.flatten()[:8].tolist()} != gloo {w.flatten()[:8].tolist()}"
            )


def both(make):
    """(tpu tensor, cpu tensor) holding the same values."""
    cpu = make()
    return cpu.to("tpu"), cpu.clone()


# -- all_reduce, every ReduceOp (gloo has no AVG: it is SUM / size there)
ops = {
    "sum": dist.ReduceOp.SUM,
    "product": dist.ReduceOp.PRODUCT,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "band": dist.ReduceOp.BAND,
    "bor": dist.ReduceOp.BOR,
    "bxor": dist.ReduceOp.BXOR,
}
for dtype in (torch.float32, torch.int64, torch.int32):
    for name, op in ops.items():
        if name in ("band", "bor", "bxor") and dtype.is_floating_point:
            continue
        tpu, cpu = both(lambda dtype=dtype, name=name: inputs((3, 5), dtype, salt=len(name)))
        dist.all_reduce(tpu, op=op)
        dist.all_reduce(cpu, op=op, group=GLOO)
        check(f"all_reduce {name} {dtype}", tpu, cpu)
tpu, cpu = both(lambda: inputs((6,), torch.float32))
dist.all_reduce(tpu, op=dist.ReduceOp.AVG)
dist.all_reduce(cpu, group=GLOO)
check("all_reduce avg float32", tpu, cpu / SIZE)
tpu, cpu = both(lambda: inputs((2, 3), torch.bfloat16))
dist.all_reduce(tpu)
dist.all_reduce(cpu, group=GLOO)
check("all_reduce sum bfloat16", tpu, cpu)
# a CPU tensor through the "tpu" group (DeviceMesh and DCP exchange CPU tensors)
cpu_via_tpu, cpu = both(lambda: inputs((4,), torch.float32))
cpu_via_tpu = cpu_via_tpu.cpu()
dist.all_reduce(cpu_via_tpu)
dist.all_reduce(cpu, group=GLOO)
check("all_reduce sum of a cpu tensor", cpu_via_tpu, cpu)
# a strided view is reduced in place through the view (gloo mishandles non-contiguous
# tensors, so the expected value is computed here from every rank's inputs)
tpu = inputs((4, 6), torch.float32, salt=3).to("tpu")
dist.all_reduce(tpu[:, 1::2])
want = inputs((4, 6), torch.float32, salt=3)
want[:, 1::2] = sum(_rank_inputs(r, (4, 6), 3) for r in range(SIZE))[:, 1::2]
check("all_reduce of a strided view", tpu, want)

# -- all_gather (list and into one tensor)
tpu, cpu = both(lambda: inputs((2, 3), torch.float32))
tpu_out = [torch.empty(2, 3, device="tpu") for _ in range(SIZE)]
cpu_out = [torch.empty(2, 3) for _ in range(SIZE)]
dist.all_gather(tpu_out, tpu)
dist.all_gather(cpu_out, cpu, group=GLOO)
check("all_gather", tpu_out, cpu_out)
tpu_flat, cpu_flat = torch.empty(SIZE * 2, 3, device="tpu"), torch.empty(SIZE * 2, 3)
dist.all_gather_into_tensor(tpu_flat, tpu)
dist.all_gather_into_tensor(cpu_flat, cpu, group=GLOO)
check("all_gather_into_tensor", tpu_flat, cpu_flat)

# -- reduce_scatter (list and from one tensor)
for name, op in (("sum", dist.ReduceOp.SUM), ("max", dist.ReduceOp.MAX)):
    tpu, cpu = both(lambda: inputs((SIZE * 2, 3), torch.float32, salt=7))
    tpu_out, cpu_out = torch.empty(2, 3, device="tpu"), torch.empty(2, 3)
    dist.reduce_scatter_tensor(tpu_out, tpu, op=op)
    dist.reduce_scatter_tensor(cpu_out, cpu, op=op, group=GLOO)
    check(f"reduce_scatter_tensor {name}", tpu_out, cpu_out)
tpu, cpu = both(lambda: inputs((SIZE, 4), torch.int64, salt=8))
tpu_out, cpu_out = torch.empty(4, dtype=torch.int64, device="tpu"), torch.empty(4, dtype=torch.int64)
dist.reduce_scatter(tpu_out, list(tpu.unbind(0)))
dist.reduce_scatter(cpu_out, list(cpu.unbind(0)), group=GLOO)
check("reduce_scatter list int64", tpu_out, cpu_out)

# -- broadcast, from every rank
for src in range(SIZE):
    tpu, cpu = both(lambda: inputs((5,), torch.float32, salt=9))
    dist.broadcast(tpu, src=src)
    dist.broadcast(cpu, src=src, group=GLOO)
    check(f"broadcast from {src}", tpu, cpu)

# -- all_to_all: even, uneven splits, lists
tpu, cpu = both(lambda: inputs((SIZE * 2, 3), torch.float32, salt=10))
tpu_out, cpu_out = torch.empty_like(tpu), torch.empty_like(cpu)
dist.all_to_all_single(tpu_out, tpu)
dist.all_to_all_single(cpu_out, cpu, group=GLOO)
check("all_to_all_single even", tpu_out, cpu_out)
# rank r sends (r + j) % 3 + 1 rows to rank j
sends = [(RANK + j) % 3 + 1 for j in range(SIZE)]
receives = [(j + RANK) % 3 + 1 for j in range(SIZE)]
tpu, cpu = both(lambda: inputs((sum(sends), 2), torch.float32, salt=11))
tpu_out, cpu_out = torch.empty(sum(receives), 2, device="tpu"), torch.empty(sum(receives), 2)
dist.all_to_all_single(tpu_out, tpu, receives, sends)
dist.all_to_all_single(cpu_out, cpu, receives, sends, group=GLOO)
check("all_to_all_single uneven", tpu_out, cpu_out)
tpu_in = [inputs((2,), torch.int64, salt=12 + j).to("tpu") for j in range(SIZE)]
cpu_in = [t.cpu() for t in tpu_in]
tpu_out = [torch.empty(2, dtype=torch.int64, device="tpu") for _ in range(SIZE)]
cpu_out = [torch.empty(2, dtype=torch.int64) for _ in range(SIZE)]
dist.all_to_all(tpu_out, tpu_in)
dist.all_to_all(cpu_out, cpu_in, group=GLOO)
check("all_to_all list", tpu_out, cpu_out)

# -- send / recv: every rank passes a tensor to the next one (even ranks send first)
nxt, prev = (RANK + 1) % SIZE, (RANK - 1) % SIZE
tpu, cpu = both(lambda: inputs((3,), torch.float32, salt=13))
tpu_got, cpu_got = torch.empty(3, device="tpu"), torch.empty(3)
for group, sent, got in ((None, tpu, tpu_got), (GLOO, cpu, cpu_got)):
    if RANK % 2 == 0:
        dist.send(sent, dst=nxt, group=group)
        dist.recv(got, src=prev, group=group)
    else:
        dist.recv(got, src=prev, group=group)
        dist.send(sent, dst=nxt, group=group)
check("send/recv ring", tpu_got, cpu_got)

# -- reduce, gather, scatter to/from a root
tpu, cpu = both(lambda: inputs((4,), torch.float32, salt=14))
dist.reduce(tpu, dst=SIZE - 1)
dist.reduce(cpu, dst=SIZE - 1, group=GLOO)
if RANK == SIZE - 1:  # elsewhere the buffer's contents are unspecified (gloo leaves partial sums)
    check("reduce to the last rank", tpu, cpu)
tpu, cpu = both(lambda: inputs((4,), torch.float32, salt=18))
tpu_list = [torch.empty(4, device="tpu") for _ in range(SIZE)] if RANK == 0 else None
cpu_list = [torch.empty(4) for _ in range(SIZE)] if RANK == 0 else None
dist.gather(tpu, tpu_list, dst=0)
dist.gather(cpu, cpu_list, dst=0, group=GLOO)
if RANK == 0:
    check("gather to rank 0", tpu_list, cpu_list)
pieces = [inputs((3,), torch.float32, salt=15 + j) for j in range(SIZE)]
tpu_out, cpu_out = torch.empty(3, device="tpu"), torch.empty(3)
dist.scatter(tpu_out, [p.to("tpu") for p in pieces] if RANK == 0 else None, src=0)
dist.scatter(cpu_out, pieces if RANK == 0 else None, src=0, group=GLOO)
check("scatter from rank 0", tpu_out, cpu_out)

# -- objects (pickled through byte tensors) and barrier
objects = [None] * SIZE
dist.all_gather_object(objects, {"rank": RANK})
checked.append("all_gather_object")
if objects != [{"rank": r} for r in range(SIZE)]:
    mismatches.append(f"all_gather_object: {objects}")
dist.barrier()
checked.append("barrier")

# -- functional collectives (what DTensor and compiled graphs call)
tpu, cpu = both(lambda: inputs((2, 4), torch.float32, salt=16))
want = cpu.clone()
dist.all_reduce(want, group=GLOO)
check("funcol all_reduce", funcol.all_reduce(tpu, "sum", dist.group.WORLD), want)
want = torch.empty(SIZE * 2, 4)
dist.all_gather_into_tensor(want, cpu, group=GLOO)
check("funcol all_gather_tensor", funcol.all_gather_tensor(tpu, 0, dist.group.WORLD), want)
big, big_cpu = both(lambda: inputs((SIZE * 2, 4), torch.float32, salt=17))
want = torch.empty(2, 4)
dist.reduce_scatter_tensor(want, big_cpu, group=GLOO)
check("funcol reduce_scatter_tensor", funcol.reduce_scatter_tensor(big, "sum", 0, dist.group.WORLD), want)

# -- the same inside one torch.compile(backend="tpu") graph (fullgraph: no break around them)


def collectives_graph(x):
    total = funcol.all_reduce(x * 2, "sum", dist.group.WORLD)
    rows = funcol.all_gather_tensor(total + 1, 0, dist.group.WORLD)
    return funcol.reduce_scatter_tensor(rows * 3, "max", 0, dist.group.WORLD) - 1


tpu, cpu = both(lambda: inputs((2, 4), torch.float32, salt=19))
want = cpu * 2
dist.all_reduce(want, group=GLOO)
rows = torch.empty(SIZE * 2, 4)
dist.all_gather_into_tensor(rows, want + 1, group=GLOO)
want = torch.empty(2, 4)
dist.reduce_scatter_tensor(want, rows * 3, op=dist.ReduceOp.MAX, group=GLOO)
check("compiled funcol graph", torch.compile(collectives_graph, backend="tpu", fullgraph=True)(tpu), want - 1)

# -- a ReduceOp no backend can run here fails with a clear message
try:
    dist.all_reduce(torch.ones(2, device="tpu"), op=dist._make_nccl_premul_sum(2.0))
    mismatches.append("PREMUL_SUM did not raise")
except (ValueError, RuntimeError) as error:
    checked.append("premul_sum error")
    if "PREMUL_SUM" not in str(error) and "ReduceOp" not in str(error):
        mismatches.append(f"PREMUL_SUM error does not name the op: {error}")

with open(os.path.join(sys.argv[1], f"rank{RANK}.json"), "w") as f:
    report = {"rank": RANK, "size": SIZE, "backend": dist.get_backend(), "checked": checked, "mismatches": mismatches}
    report["group"] = type(dist.group.WORLD).__name__
    json.dump(report, f)
dist.destroy_process_group()
