"""Saving and loading state dicts that hold tpu tensors; deepcopy."""

import copy
import io
import warnings

import pytest
import torch

import tpu_backend  # noqa: F401


def _save(obj) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return buffer


def test_state_dict_saved_on_tpu_loads_on_cpu_and_on_tpu():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).to("tpu")
    state = model.state_dict()
    on_cpu = torch.load(_save(state), map_location="cpu")
    on_tpu = torch.load(_save(state))
    weights_only = torch.load(_save(state), weights_only=True)
    for name, value in state.items():
        assert on_cpu[name].device.type == "cpu"
        assert on_tpu[name].device == torch.device("tpu", 0) and weights_only[name].device.type == "tpu"
        torch.testing.assert_close(on_cpu[name], value.cpu(), rtol=0, atol=0)
        torch.testing.assert_close(on_tpu[name].cpu(), value.cpu(), rtol=0, atol=0)


def test_cpu_checkpoint_loads_onto_tpu_with_map_location():
    model = torch.nn.Linear(3, 2)
    loaded = torch.load(_save(model.state_dict()), map_location="tpu")
    assert loaded["weight"].device.type == "tpu"
    torch.testing.assert_close(loaded["weight"].cpu(), model.weight)


def test_load_state_dict_round_trip_between_devices():
    source = torch.nn.Linear(5, 3).to("tpu")
    target = torch.nn.Linear(5, 3)
    target.load_state_dict(source.state_dict())
    torch.testing.assert_close(target.weight, source.weight.cpu())
    back = torch.nn.Linear(5, 3).to("tpu")
    back.load_state_dict(target.state_dict())
    torch.testing.assert_close(back.bias.cpu(), source.bias.cpu())
    assert back.bias.device.type == "tpu"


def test_parameters_keep_requires_grad_through_save():
    p = torch.nn.Parameter(torch.randn(3).to("tpu"))
    loaded = torch.load(_save(p), weights_only=False)
    assert isinstance(loaded, torch.nn.Parameter) and loaded.requires_grad and loaded.device.type == "tpu"


def test_deepcopy_of_tpu_model_is_independent():
    model = torch.nn.Linear(3, 3).to("tpu")
    clone = copy.deepcopy(model)
    with torch.no_grad():
        clone.weight.add_(1)
    torch.testing.assert_close(clone.weight.cpu(), model.weight.cpu() + 1)
    x = torch.randn(2).to("tpu")
    y = copy.deepcopy(x)
    assert y.device.type == "tpu" and torch.equal(y.cpu(), x.cpu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool, torch.int64])
def test_storage_cpu_clone_deepcopy_and_tolist_hold_the_tensors_bytes(dtype):
    """PyTorch's Python storage methods on a tpu storage: the tensor's bytes, not an empty copy
    (the storage's C++ size is 0) or a crash (cloning allocated through a missing allocator)."""
    host = (torch.arange(6) % 3).to(dtype).reshape(2, 3)
    t = host.to("tpu").clone()  # an op's result: made on the compiled path when it is built
    want = bytes(host.untyped_storage())
    assert bytes(t.untyped_storage().cpu()) == want
    assert t.untyped_storage().tolist() == list(want)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated
        assert t.storage().tolist() == host.flatten().tolist()
    for copied in (t.untyped_storage().clone(), copy.deepcopy(t.untyped_storage())):
        assert copied.device.type == "tpu" and bytes(copied.cpu()) == want
        t.zero_()  # the copy keeps its own values
        assert bytes(copied.cpu()) == want
        t.copy_(host.to("tpu"))
        view = torch.empty(0, dtype=dtype, device="tpu").set_(copied, 0, (2, 3), (3, 1))
        assert torch.equal(view.cpu(), host)
