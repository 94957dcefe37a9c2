"""tpu_backend.aot: a sharded training step compiled for a TPU topology on this CPU host.

Needs libtpu (installed by tools/setup.sh with JAX's `tpu` extra), not a chip."""

import json
import os
import sys

import pytest
import torch
from torch import nn

import tpu_backend.aot as aot
from kernels.tpu import libtpu_version
from tpu_backend import kernels as device_kernels
from tpu_backend.aot.report import count_rematerialized

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from examples.llama_fsdp_tp import aot_step  # noqa: E402

needs_libtpu = pytest.mark.skipif(libtpu_version() is None, reason="compiling for TPU needs libtpu")


@pytest.fixture(autouse=True)
def kernels_off():
    with device_kernels.use("off"):
        yield


@pytest.fixture(scope="module")
def fsdp_tp_report():
    with device_kernels.use("off"):
        step = aot_step("tiny", batch=8)
        return aot.compile_step(
            step["model"],
            step["inputs"],
            step["targets"],
            step["loss"],
            topology="v5e:2x2",
            mesh="fsdp=2,tp=2",
            tensor_parallel=step["tensor_parallel"],
        )


@needs_libtpu
def test_sharded_step_reports_per_chip_memory_cost_and_collectives(fsdp_tp_report):
    r = fsdp_tp_report
    assert (r.chips, r.device_kind, r.mesh) == (4, "TPU v5 lite", {"fsdp": 2, "tp": 2})
    assert r.hbm_bytes == 16_909_336_064 and r.fits  # the 15.75 GiB of 16 a v5e program may use
    # every parameter is split over both axes: each chip holds a quarter of the bf16 weights
    # (within the 1-D norm weights FSDP splits only in two), AdamW's two moments twice that
    whole = r.parameters * 2
    assert whole / 4 <= r.state_bytes["parameters"] <= whole / 4 * 1.1
    assert r.state_bytes["optimizer state"] >= 2 * r.state_bytes["parameters"]
    assert r.state_bytes["batch rows per chip"] == 4  # batch 8 over fsdp=2
    assert r.argument_bytes >= r.state_bytes["parameters"] + r.state_bytes["optimizer state"]
    assert r.alias_bytes > 0  # donated parameters and moments are updated in place
    assert r.total_bytes == r.argument_bytes + r.output_bytes - r.alias_bytes + r.temp_bytes + r.code_bytes
    assert r.flops > 0 and r.bytes_accessed > 0
    assert r.collectives["all-gather"] > 0  # FSDP gathers weights
    assert r.collectives["all-reduce"] > 0  # TP's row-parallel sums, the loss
    assert r.seconds["compile"] > 0
    assert r.rematerialized == 0  # a tiny step has HBM to spare
    assert set(json.loads(json.dumps(r.to_json()))) >= {"total_bytes", "fits", "collectives", "flops", "advice"}


@pytest.mark.slow  # the default suite's time budget: run with -m slow
@needs_libtpu
def test_command_prints_table_and_writes_json(tmp_path, capsys):
    from tpu_backend.aot.__main__ import main

    out = tmp_path / "report.json"
    script = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "llama_fsdp_tp.py")
    argv = [script, "--topology", "v5e:2x2", "--mesh", "fsdp=4", "--size", "tiny", "--remat", "full"]
    code = main([*argv, "--batch", "8", "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert "temporaries" in printed and "all-gather" in printed and "compiling for 4 chips" in printed
    report = json.loads(out.read_text())
    assert report["mesh"] == {"fsdp": 4} and report["fits"] is True
    assert report["state_bytes"]["batch rows per chip"] == 2
    assert report["remat"] == "full" and 0 < report["mfu_estimate"] < 1
    assert "activation checkpointing" in printed and "MFU at the roofline" in printed


@needs_libtpu
def test_step_that_cannot_fit_is_refused_naming_what_to_shrink():
    with torch.device("meta"):  # 4 x 4.3G float32 weights, replicated: ~200 GiB per chip with AdamW
        model = nn.Sequential(*(nn.Linear(65536, 65536, bias=False) for _ in range(4)))
    batch = [((8, 65536), torch.float32)]
    with pytest.raises(aot.StepDoesNotFit, match="does not fit v5e:2x2") as refused:
        aot.compile_step(
            model, batch, batch, nn.functional.mse_loss, topology="v5e:2x2", mesh="dp=4", optimizer="sgd", check=True
        )
    assert "FSDP" in str(refused.value)


def test_mesh_must_match_the_topology_and_name_known_axes():
    with pytest.raises(ValueError, match="fsdp=64,tp=4"):
        aot.parse_mesh("fsdp:64")
    if libtpu_version() is None:
        return
    with pytest.raises(ValueError, match="v5e:2x2 has 4 chips"):
        aot.device_mesh("v5e:2x2", {"fsdp": 8})
    with pytest.raises(ValueError, match="use dp, fsdp, tp"):
        aot.device_mesh("v5e:2x2", {"data": 4})


def test_collectives_are_counted_from_hlo_text():
    hlo = """ENTRY %main {
  %a = bf16[4,8]{1,0} all-gather-start(bf16[1,8]{1,0} %p), replica_groups={}
  %b = bf16[4,8]{1,0} all-gather-done(%a)
  %c = f32[] all-reduce(f32[] %x), to_apply=%add
  %d = f32[2]{0} reduce-scatter(f32[4]{0} %y), dimensions={0}
  %e = f32[2]{0} collective-permute-start(f32[2]{0} %d), source_target_pairs={{0,1}}
  %fusion.7.remat2 = bf16[4,8]{1,0} fusion(%b), kind=kLoop
}"""
    counts = aot.count_collectives(hlo)
    assert counts == {
        "all-reduce": 1,
        "all-gather": 1,
        "reduce-scatter": 1,
        "all-to-all": 0,
        "collective-permute": 1,
    }
    assert count_rematerialized(hlo) == 1


def test_fsdp_with_tensor_parallel_splits_each_weight_over_both_axes():
    if libtpu_version() is None:
        pytest.skip("needs libtpu for the compile-only devices")
    from jax.sharding import PartitionSpec as P

    from tpu_backend.distributed.fsdp import parameter_sharding

    mesh = aot.device_mesh("v5e:2x2", {"fsdp": 2, "tp": 2})
    # column-parallel weight (out split over tp): FSDP takes the input dim
    assert parameter_sharding((64, 32), mesh, "fsdp", P("tp")).spec == P("tp", "fsdp")
    # a vector split by tp: FSDP splits the same dim further
    assert parameter_sharding((64,), mesh, "fsdp", P("tp")).spec == P(("tp", "fsdp"))
    # no plan: the first divisible dim, as fully_shard does
    assert parameter_sharding((3, 64), mesh, "fsdp").spec == P(None, "fsdp")


def test_refusal_with_small_arguments_points_at_the_activations():
    from tpu_backend.aot.report import Buffer

    message = (
        "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries "
        "(301.57G) exceeds available HBM (15.75G)."
    )
    refused = aot.StepDoesNotFit(None, message, "v5e:16x16", [Buffer("output.weight", 2**26, "parameter")])
    assert refused.required_temp_bytes == int(301.57 * 2**30)
    assert "temporaries (activations kept for the backward pass) are what does not fit" in str(refused)
    assert "FSDP" not in str(refused)


@needs_libtpu
def test_sharded_step_keeps_the_kernels_each_split_by_shard_map():
    """fsdp=2 x tp=2 with the kernels on: each kernel (forward and backward) compiles for
    the v5e inside a shard_map (XLA cannot partition a Mosaic kernel): attention over
    batch and heads, the RMSNorms over rows, cross-entropy over rows and the vocabulary."""
    from benchmarks.models import LlamaConfig, LlamaLM, sequence_loss
    from tpu_backend.distributed import ColwiseParallel, RowwiseParallel

    config = LlamaConfig(vocab=256, context=128, width=128, heads=2, layers=1, ffn=256, dtype=torch.bfloat16)
    with torch.device("meta"):
        model = LlamaLM(config)
    plan = {
        "blocks.*.[qkv]": ColwiseParallel(),
        "blocks.*.o": RowwiseParallel(),
        "blocks.*.gate": ColwiseParallel(),
        "blocks.*.up": ColwiseParallel(),
        "blocks.*.down": RowwiseParallel(),
        "head": ColwiseParallel(),  # logits split over the vocabulary
    }
    tokens = ((4, config.context), torch.long)
    device_kernels.reset_stats()
    with device_kernels.use("on"):  # "auto" leaves norms this small to XLA (measured faster)
        report = aot.compile_step(
            model, [tokens], [tokens], sequence_loss, topology="v5e:2x2", mesh="fsdp=2,tp=2", tensor_parallel=plan
        )
    assert not any("xla" in key for key in device_kernels.stats()), device_kernels.stats()
    assert report.kernels and report.fits
    assert report.kernel_calls == {
        "cross_entropy_backward": 1,
        "cross_entropy_forward": 1,
        "flash_attention_dkv": 1,
        "flash_attention_dq": 1,
        "flash_attention_forward": 1,
        "norm_backward": 3,
        "norm_forward": 3,
    }


def _llama(layers=4, **sizes):
    from benchmarks.models import LlamaConfig, LlamaLM

    config = LlamaConfig(**{**dict(vocab=512, context=1024, width=128, heads=2, ffn=256, layers=layers), **sizes})
    with torch.device("meta"):
        return LlamaLM(config), ((2, config.context), torch.long)


@needs_libtpu
def test_remat_policies_trade_the_steps_memory_for_recomputation_and_mfu():
    """`--remat full` keeps each block's input and recomputes the rest in the backward (more
    FLOPs, fewer HBM temporaries): XLA neither merges the recomputation back into the forward
    nor runs every block's at once (the fences). (`matmuls` is checked for exactness in
    test_one_program_step.py; its memory in `benchmarks.device.step_memory`.)"""
    from benchmarks.models import sequence_loss

    model, tokens = _llama()  # big enough that the temporaries live in HBM, not the chip's VMEM
    reports = {
        policy: aot.compile_step(
            model, [tokens], [tokens], sequence_loss, topology="v5e:1x1", mesh="dp=1", kernels=False, remat=policy
        )
        for policy in ("none", "full")
    }
    none, full = reports["none"], reports["full"]
    assert full.temp_bytes < 0.6 * none.temp_bytes
    assert full.flops > 1.15 * none.flops  # each block's forward once more
    assert (full.remat, none.remat) == ("full", "none")

    # the MFU estimate: 6 x parameters x tokens over the chip's peak in the roofline time
    parameters = sum(p.numel() for p in model.parameters())
    assert none.tokens == 2 * 1024 and none.parameters == parameters
    assert none.model_flops == 6 * parameters * 2 * 1024
    seconds = max(none.flops / 197e12, none.bytes_accessed / 819e9)
    assert none.roofline_seconds == pytest.approx(seconds)
    assert none.mfu_estimate == pytest.approx(none.model_flops / (seconds * 197e12))
    assert 0 < full.mfu_estimate < none.mfu_estimate < 1  # recomputation is charged
    assert json.loads(json.dumps(none.to_json()))["mfu_estimate"] == pytest.approx(none.mfu_estimate)


@needs_libtpu
def test_fsdp_gathers_each_weight_instead_of_the_global_batchs_activations():
    """Left alone, XLA kept the tensor-parallel head's weight split over fsdp and split the
    activations over the contracting dimension instead: every chip computed the logits of the
    whole global batch (31 GiB per chip for Llama-3-8B at 64 x 8192 tokens on v5e:16x16). The
    plan gathers each weight where it is used, as FSDP does: a chip holds its own rows'."""
    from examples.llama_fsdp_tp import Llama, LlamaConfig, device_tensor_parallel_plan, loss_fn

    with torch.device("meta"):
        model = Llama(LlamaConfig(vocab=16384, dim=256, layers=2, heads=4, hidden=512, seq=512)).to(torch.bfloat16)
    tokens = ((8, 512), torch.long)  # 4096 tokens; 2048 per fsdp shard; 8192 of the vocabulary per tp shard
    report = aot.compile_step(
        model,
        [tokens],
        [tokens],
        loss_fn,
        topology="v5e:2x2",
        mesh="fsdp=2,tp=2",
        tensor_parallel=device_tensor_parallel_plan(),
        kernels=False,
    )
    assert [b for b in report.largest if "[2048, 8192]" in b.what]  # a chip's own logits
    assert not [b for b in report.largest if "[4096, 8192]" in b.what]  # never the global batch's


def test_remat_needs_repeated_blocks_and_a_known_policy():
    from tpu_backend.aot.capture import trace_step

    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    batch = [((2, 8), torch.float32)]
    with pytest.raises(ValueError, match="no stack of repeated blocks"):
        trace_step(model, batch, [((2, 4), torch.float32)], nn.functional.mse_loss, remat="full")
    with pytest.raises(ValueError, match="use one of none, full, matmuls"):
        trace_step(model, batch, [((2, 4), torch.float32)], nn.functional.mse_loss, remat="dots")


def test_the_planned_loss_hands_16bit_logits_to_the_cross_entropy_kernel():
    """`F.cross_entropy(logits.float(), t)` in a step traced without Dynamo: the kernel reads the
    bf16 logits and computes in float32 itself, so no float32 copy of the logits (1 GiB of the
    374M step at 4 x 2048 tokens) is written and kept for the backward."""
    from benchmarks.models import sequence_loss
    from tpu_backend.aot.capture import trace_step

    model, tokens = _llama(layers=2, dtype=torch.bfloat16)
    with device_kernels.use("on"):
        step = trace_step(model, [tokens], [tokens], sequence_loss)
    calls = [n for n in step.joint.graph.nodes if n.target == torch.ops.tpu_kernels.cross_entropy.default]
    assert len(calls) == 1 and calls[0].args[0].meta["val"].dtype == torch.bfloat16
