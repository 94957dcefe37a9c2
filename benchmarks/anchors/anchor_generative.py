"""Run the anchor's generative export (litert-torch 0.10.0 `export_hf`) on a saved model
folder, in the anchor's own environment. Prints one JSON line: seconds and the path of
the .tflite. Called by generative_bench.py and generative_quant_bench.py --anchor-python;
imports nothing from this repository. The optional fifth argument is the anchor's
`quantization_recipe` (default "none": float; e.g. "dynamic_wi4b32_afp32", a name from
ai_edge_quantizer.recipe, applied by export_hf after conversion).

    /tmp/anchor-venv/bin/python benchmarks/anchors/anchor_generative.py MODEL_DIR OUT.tflite 32 256 [RECIPE]
"""

from __future__ import annotations

import glob
import importlib.machinery
import json
import os
import shutil
import sys
import tempfile
import time
import types


def _tensorflow_schema_shim() -> None:
    """export_hf imports `tensorflow.lite.python.schema_py_generated` when it is imported
    (model_ext/bonsai_flux2) although text export never uses it; the same generated module
    ships in ai_edge_litert, so it stands in for tensorflow (not installed: hundreds of MB)."""
    from ai_edge_litert import schema_py_generated

    for name in ("tensorflow", "tensorflow.lite", "tensorflow.lite.python"):
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules.setdefault(name, module)
    sys.modules["tensorflow.lite.python"].schema_py_generated = schema_py_generated
    sys.modules["tensorflow.lite.python.schema_py_generated"] = schema_py_generated


def main(model_dir: str, out_path: str, prefill_len: int, cache_len: int, recipe: str = "none") -> None:
    _tensorflow_schema_shim()
    start = time.perf_counter()
    from litert_torch.generative.export_hf import export

    import_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as work:
        start = time.perf_counter()
        export.export(
            model=model_dir,
            output_dir=work,
            prefill_lengths=[prefill_len],
            cache_length=cache_len,
            bundle_litert_lm=False,
            quantization_recipe=recipe,
            keep_temporary_files=True,
        )
        export_s = time.perf_counter() - start
        # float: model.tflite; with a recipe the quantizer writes model_quantized.tflite beside it
        name = "model.tflite" if recipe.strip().lower() == "none" else "model_quantized.tflite"
        found = sorted(glob.glob(os.path.join(work, "**", name), recursive=True))
        if not found:
            raise SystemExit(f"the anchor wrote no {name} under {work}: {os.listdir(work)}")
        shutil.copyfile(found[0], out_path)
    print(json.dumps({"import_s": import_s, "export_s": export_s, "recipe": recipe, "path": out_path}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), *sys.argv[5:6])
