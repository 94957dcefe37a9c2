"""Another installed package named like one of ours (Hugging Face's `kernels`, which
transformers imports when it is installed): one ImportError that names both packages and
the fix, whichever of the two Python finds first. The other distribution is a fake one
built in tmp_path (name, version and files as pip installs them); nothing is downloaded."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from common import package_names

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# What transformers' hub_kernels imports from Hugging Face's `kernels` (0.18.x).
FAKE_KERNELS = '''
"""Stand-in for Hugging Face's `kernels` (hub kernels for transformers)."""
__version__ = "0.18.2"


def __getattr__(name):  # every name a factory of no-op decorators (use_kernel_forward_from_hub(...))
    return lambda *args, **kwargs: (lambda obj: obj)
'''


def _fake_hf_kernels(site):
    (site / "kernels").mkdir(parents=True)
    (site / "kernels" / "__init__.py").write_text(FAKE_KERNELS)
    info = site / "kernels-0.18.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kernels\nVersion: 0.18.2\n")
    (info / "RECORD").write_text("kernels/__init__.py,,\nkernels-0.18.2.dist-info/METADATA,,\n")
    return site


def _run(code, *path, cwd=ROOT):
    """`python -c code` with `path` as PYTHONPATH, in `cwd` (first on sys.path)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in path)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def test_no_clash_in_this_environment():
    assert package_names.clashes() == {}


SMALL_LLAMA = """
from transformers import LlamaConfig, LlamaForCausalLM
LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1))
"""


@pytest.mark.parametrize(
    "code, ours_first",
    [
        ("import litert_torch", True),  # ours found first: transformers would get our `kernels`
        ("import tpu_backend", False),  # theirs found first: our code would get theirs
        (SMALL_LLAMA, True),  # transformers on its own, from the repository root
    ],
    ids=["litert_torch", "tpu_backend-theirs-first", "transformers"],
)
def test_hugging_face_kernels_installed_too(tmp_path, code, ours_first):
    site = _fake_hf_kernels(tmp_path / "site")
    if ours_first:  # from the repository root, as `python -c` / pytest there: ours comes first
        result = _run(code, ROOT, site)
    else:  # from elsewhere, theirs first on PYTHONPATH
        result = _run(code, site, ROOT, cwd=tmp_path)
    assert result.returncode != 0
    error = result.stderr
    assert "ImportError" in error or "PackageNameClashError" in error, error
    assert f"'kernels': this project's {os.path.join(ROOT, 'kernels')}" in error, error
    assert f"the distribution 'kernels' 0.18.2 ({site / 'kernels'})" in error, error
    assert "python -m pip uninstall kernels" in error, error


def test_a_folder_of_the_same_name_next_to_the_script(tmp_path, monkeypatch):
    (tmp_path / "runtimes").mkdir()
    (tmp_path / "runtimes" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(package_names.PackageNameClashError) as error:
        package_names.check_top_level_names(("common", "converter", "runtimes"))
    message = str(error.value)
    assert (
        f"'runtimes': this project's {os.path.join(ROOT, 'runtimes')} and another package at {tmp_path / 'runtimes'}"
        in message
    )
    assert "rename or move the other package" in message and "pip uninstall" not in message


def test_theirs_found_first_and_litert_torch_never_imports_kernels(tmp_path):
    """Hugging Face's `kernels` first on the path: transformers gets its own, and
    litert_torch (which never imports `kernels`) converts a transformers model."""
    site = _fake_hf_kernels(tmp_path / "site")
    code = SMALL_LLAMA.replace("LlamaForCausalLM(LlamaConfig", "model = LlamaForCausalLM(LlamaConfig") + (
        "import torch, litert_torch\n"
        "edge = litert_torch.convert(model.eval(), (torch.zeros(1, 4, dtype=torch.long),), {'use_cache': False})\n"
        "import kernels; print('kernels from', kernels.__file__)\n"
    )
    result = _run(code, site, ROOT, cwd=tmp_path)  # not the repository root, which would come first
    assert result.returncode == 0, result.stderr
    assert f"kernels from {site / 'kernels' / '__init__.py'}" in result.stdout
