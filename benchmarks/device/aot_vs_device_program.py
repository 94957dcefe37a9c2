"""Is `tpu_backend.aot`'s step the device's own? Compare, compiled for one v5e on this CPU
host, the memory of the step `aot` traces (fake tensors, no weights) with the program the
device actually builds for the same step (`torch.compile(backend="tpu")` run once with real
weights on CPU, then `Program.export(platforms=("tpu",))`).

    python -m benchmarks.device.aot_vs_device_program        # 4 layers, width 512, sequence 2048, batch 1

The device's exported program carries no donation (an `Exported` has none), so compare
arguments and temporaries, not aliasing. Measured 2026-12-04: arguments 102,578,688 bytes
in both; temporaries 894,507,008 (aot) vs 902,910,464 (device), 0.9% apart.
"""

from __future__ import annotations

import sys


def main() -> int:
    import jax
    import torch

    import tpu_backend.aot as aot
    from examples.llama_fsdp_tp import PRESETS, Llama, LlamaConfig, aot_step
    from kernels.tpu import compile_only_devices
    from tpu_backend import kernels as device_kernels
    from tpu_backend.aot.capture import adamw_device_step
    from tpu_backend.compile import programs

    device_kernels.use("off")
    PRESETS["crosscheck"] = LlamaConfig(vocab=4096, dim=512, layers=4, heads=8, hidden=1408, seq=2048)
    step = aot_step("crosscheck", batch=1)
    planned = aot.compile_step(
        step["model"], step["inputs"], step["targets"], step["loss"], topology="v5e:1x1", mesh="dp=1"
    )

    config = step["model"].config
    torch.manual_seed(0)
    model = Llama(config).to(torch.bfloat16).to("tpu")
    tokens = torch.randint(0, config.vocab, (1, config.seq + 1), generator=torch.Generator().manual_seed(0))
    adamw_device_step(model, step)(tokens[:, :-1].to("tpu"), tokens[:, 1:].to("tpu"))

    sharding = jax.sharding.SingleDeviceSharding(compile_only_devices("v5e:1x1")[0])
    print(f"{'':34}{'arguments':>14}{'temporaries':>14}")
    print(f"{'tpu_backend.aot (traced)':34}{planned.argument_bytes:>14,}{planned.temp_bytes:>14,}")
    for program in programs():
        for exported in program.export(platforms=("tpu",), chip="v5e"):
            args = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding) for a in exported.in_avals]
            memory = jax.jit(exported.call).lower(*args).compile().memory_analysis()
            name = f"device: {program.name}"
            print(f"{name:34}{memory.argument_size_in_bytes:>14,}{memory.temp_size_in_bytes:>14,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
