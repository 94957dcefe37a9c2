"""The Pallas kernels split over a mesh (`kernels.sharded`): on 4 CPU devices (fsdp=2 x
tp=2, kernels interpreted) the training step's loss and gradients equal the same step on
one device, for `tpu_backend.aot`'s step and for the device's eager path under
`tpu_backend.distributed`. In a subprocess (`kernels_on_mesh.py`): JAX reads the device
count at start-up."""

import json

import pytest

from tests.tpu_backend.distributed.test_distributed import run

# float32 throughout: the split changes only the order of the sums (the vocabulary's
# logsumexp pieces, the norm weights' row sums, FSDP and TP's reductions)
LOSS_RTOL = 1e-6
GRADIENT_RTOL = 1e-5  # of each gradient's largest element
ALL_KERNELS = {"rms_norm: kernel", "scaled_dot_product_attention: kernel", "cross_entropy: kernel"}


def assert_same_step(loss_single, loss_sharded, gradient_error, what):
    assert abs(loss_sharded - loss_single) <= LOSS_RTOL * abs(loss_single), (what, loss_sharded, loss_single)
    assert len(gradient_error) == 12, what
    name, worst = max(gradient_error.items(), key=lambda item: item[1])
    assert worst <= GRADIENT_RTOL, f"{what}: gradient of {name} off by {worst:.1e} of its largest element"


@pytest.mark.slow  # ~40 s of CPU (tracing, interpreted kernels, eager programs); minutes on a loaded host
def test_sharded_step_with_kernels_equals_one_device(tmp_path):
    out = tmp_path / "report.json"
    run(["tests/tpu_backend/distributed/kernels_on_mesh.py", "--eager", "--out", str(out)], devices=4)
    r = json.loads(out.read_text())
    assert r["devices"] == 4
    # the aot step: every kernel taken, each call (forward and backward) a shard_map:
    # 3 RMSNorms, 1 attention, 1 cross-entropy
    assert r["routed"] == {"rms_norm: kernel": 6, "scaled_dot_product_attention: kernel": 2, "cross_entropy: kernel": 2}
    assert r["manual_computations"] == 10
    assert_same_step(r["loss_single"], r["loss_sharded"], r["gradient_error"], "aot step")
    # eager, tpu_backend.distributed's mesh: the kernels split by default, backward included
    assert set(r["eager_routed"]) == ALL_KERNELS
    assert r["eager_split"] == [
        "attention_backward",
        "attention_forward",
        "cross_entropy_backward",
        "cross_entropy_forward",
        "norm_backward",
        "norm_forward",
    ]
    assert_same_step(r["eager_loss_single"], r["eager_loss_sharded"], r["eager_gradient_error"], "eager")
