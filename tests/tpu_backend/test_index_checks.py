"""An index out of range on the device raises what CPU raises, by the next synchronisation.

XLA clamps an out-of-range gather index: before these checks `torch.ones(3, device="tpu")
[torch.tensor([5])]` returned `tensor([1.])`. Each case runs on CPU first (what PyTorch
raises) and then on the device in strict and fused modes, where the error comes at the first
host read after the op, naming the op and this file's line.
"""

from __future__ import annotations

import pytest
import torch

import tpu_backend
from tpu_backend.eager import bounds

x = torch.arange(12.0).reshape(3, 4)
CASES = {
    "index": lambda t, i: t[i],
    "index-two-dims": lambda t, i: t[i, i],
    "index_select": lambda t, i: t.index_select(0, i),
    "embedding": lambda t, i: torch.nn.functional.embedding(i, t),
    "gather": lambda t, i: t.gather(0, i[:, None].expand(-1, 4)),
    "scatter_add": lambda t, i: t.scatter_add(0, i[:, None].expand(-1, 4), torch.ones(len(i), 4, device=t.device)),
    "index_add": lambda t, i: t.index_add(0, i, torch.ones(len(i), 4, device=t.device)),
    "index_put": lambda t, i: t.index_put((i,), torch.zeros(4, device=t.device)),
    "index_fill": lambda t, i: t.index_fill(0, i, -1.0),
    "take": lambda t, i: t.take(i * 4),
}


@pytest.fixture(params=["strict", "fused"])
def mode(request):
    tpu_backend.set_eager_mode(request.param)
    yield request.param
    tpu_backend.set_eager_mode("strict")
    bounds.discard_pending()


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("index", [[0, 5], [2, -4]], ids=["too-large", "too-negative"])
def test_an_out_of_range_index_raises_cpus_error_at_the_next_read(mode, case, index):
    fn = CASES[case]
    with pytest.raises((IndexError, RuntimeError)) as on_cpu:
        fn(x.clone(), torch.tensor(index))
    out = fn(x.to("tpu"), torch.tensor(index, device="tpu"))  # queued: nothing read yet
    with pytest.raises(type(on_cpu.value), match=r"out of bounds for dimension \d with size \d+ \(aten\.") as got:
        out.cpu()
    assert "test_index_checks.py" in str(got.value)  # the line that made the bad call
    assert tpu_backend.device.synchronize() is None  # reported once


@pytest.mark.parametrize("case", list(CASES))
def test_indices_in_range_give_cpus_values(mode, case):
    fn = CASES[case]
    index = [2, 0, 1]
    try:
        want = fn(x.clone(), torch.tensor(index))
    except (IndexError, RuntimeError):  # (no case refuses these)
        raise
    got = fn(x.to("tpu"), torch.tensor(index, device="tpu"))
    torch.testing.assert_close(got.cpu(), want)
    wrapping = {"index": [-1, -3], "index-two-dims": [-1, -3], "index_put": [-1], "index_fill": [-2], "take": [-1]}
    if case in wrapping:  # negative indices where PyTorch wraps them
        torch.testing.assert_close(
            fn(x.to("tpu"), torch.tensor(wrapping[case], device="tpu")).cpu(),
            fn(x.clone(), torch.tensor(wrapping[case])),
        )


def test_the_error_comes_at_synchronize_and_at_item_too():
    bad = torch.ones(3, device="tpu")[torch.tensor([5], device="tpu")]
    with pytest.raises(IndexError, match="index 5 is out of bounds for dimension 0 with size 3"):
        torch.tpu.synchronize()
    torch.ones(3, device="tpu")[torch.tensor([3], device="tpu")].sum()
    with pytest.raises(IndexError, match="index 3 is out of bounds"):
        torch.ones(2, device="tpu").sum().item()
    assert bad.shape == (1,)


def test_a_cpu_index_into_a_tpu_tensor_is_checked_too():
    """`x[torch.tensor([5])]` with the index on the host, as users write it."""
    out = torch.ones(3, device="tpu")[torch.tensor([5])]
    with pytest.raises(IndexError, match="index 5 is out of bounds for dimension 0 with size 3"):
        print(out)


@pytest.mark.parametrize("device", ["cpu", "tpu"])
def test_an_index_that_is_a_strided_view_is_read_through_its_strides(device):
    """A transposed index (a view of its storage): its own values are checked, not the
    storage's order."""
    index = torch.tensor([[0, 9], [1, 2]], device=device).t()  # the 9 is at [1, 0]
    with pytest.raises(IndexError, match="index 9 is out of bounds for dimension 0 with size 5"):
        torch.ones(5, 3, device="tpu")[index].cpu()
    within = torch.tensor([[0, 4], [1, 2]], device=device).t()
    torch.testing.assert_close(torch.arange(5.0, device="tpu")[within].cpu(), torch.tensor([[0.0, 1.0], [4.0, 2.0]]))


LOSSES = {
    "cross_entropy": lambda logits, target: torch.nn.functional.cross_entropy(logits, target),
    "nll_loss": lambda logits, target: torch.nn.functional.nll_loss(logits.log_softmax(-1), target),
    "cross_entropy 4-D (nll_loss2d)": lambda logits, target: torch.nn.functional.cross_entropy(
        logits[:, :, None, None], target[:, None, None]
    ),
}


@pytest.mark.parametrize("loss", list(LOSSES))
@pytest.mark.parametrize("target", [[0, 5], [0, -3]], ids=["too-large", "negative"])
def test_a_loss_target_out_of_range_raises_cpus_error_not_nan(mode, loss, target):
    """Before the check the device gave nan (5) or a finite wrong loss (-3): silently."""
    logits = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
    with pytest.raises(IndexError, match=f"Target {target[1]} is out of bounds"):
        LOSSES[loss](logits, torch.tensor(target))
    out = LOSSES[loss](logits.to("tpu"), torch.tensor(target, device="tpu"))
    with pytest.raises(IndexError, match=rf"Target {target[1]} is out of bounds \(classes: 3\) \(aten\.nll_loss"):
        out.item()


@pytest.mark.parametrize("loss", list(LOSSES))
def test_the_ignore_index_is_not_out_of_range(mode, loss):
    logits = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
    target = torch.tensor([2, -100])
    want = LOSSES[loss](logits, target)
    got = LOSSES[loss](logits.to("tpu"), target.to("tpu"))
    torch.testing.assert_close(got.cpu(), want)
