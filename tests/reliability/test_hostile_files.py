"""Hostile .tflite files: `litert_torch.load`, `EdgeModel(...)` and `litert-torch
inspect/check/bench` raise a clear error on damaged models and never crash the process.

Every damaged file is checked by `runtimes.verify` before the interpreter sees it. The
random (byte-level) fuzz runs each file in a worker subprocess (`hostile.run_files`), so a
crash is counted, not fatal to pytest. `RELIABILITY_HOSTILE_CASES=N pytest -m slow ...`
sets the size of the long run.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys

import pytest

import litert_torch
from litert_torch import cli
from litert_torch.edge_model import EdgeModel
from runtimes.verify import InvalidModelError, verify_model
from tests.reliability import mutations
from tests.reliability.hostile import run_files, summarize

CLEAN_OUTCOMES = {"ran", "rejected", "runtime-error"}


@pytest.fixture(scope="module")
def corpus():
    return mutations.corpus()


@pytest.mark.parametrize("name", list(mutations.STRUCTURAL))
def test_structural_damage_is_named(corpus, tmp_path, name, capsys):
    bad = mutations.structural_mutation(corpus["conv_head"], name)
    fragment = mutations.STRUCTURAL[name][1]
    with pytest.raises(InvalidModelError, match="this model is not a valid LiteRT model") as info:
        EdgeModel(bad)
    assert fragment in str(info.value)
    path = tmp_path / "bad.tflite"
    path.write_bytes(bad)
    with pytest.raises(ValueError, match=f"{path} is not a valid LiteRT model"):
        litert_torch.load(path)
    for command in (["inspect"], ["check", "--target", "web"], ["bench", "--runs", "1"]):
        assert cli.main([*command, str(path)]) == cli.EXIT_FAILED, command
        assert fragment in capsys.readouterr().err, command


# Files that crash the bare interpreter (ai-edge-litert 2.3.0), found by the fuzz below:
# mutation -> what the bare interpreter does before it dies.
CRASHERS = {
    "signature subgraph out of range": "it.get_signature_runner('serving_default').get_input_details()",
    "op input -1 where no input is optional": "it.get_signature_runner('serving_default')(x=np.zeros((1, 3, 8, 8), np.float32))",
}


@pytest.mark.parametrize("name", list(CRASHERS))
def test_files_that_crash_the_bare_interpreter_are_refused(corpus, tmp_path, name):
    """Why we verify: each of these files kills a process that hands it to LiteRT directly.
    If one stops crashing, LiteRT now checks it itself: update docs/reliability.md."""
    path = tmp_path / "bad.tflite"
    path.write_bytes(mutations.structural_mutation(corpus["conv_head"], name))
    code = (
        "import sys; import numpy as np; from ai_edge_litert.interpreter import Interpreter; "
        f"it = Interpreter(model_path=sys.argv[1]); {CRASHERS[name]}"
    )
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, timeout=120)
    assert done.returncode < 0, (done.returncode, done.stderr[-500:])
    with pytest.raises(InvalidModelError, match=mutations.STRUCTURAL[name][1].replace("(", r"\(").replace(")", r"\)")):
        litert_torch.load(path)


def test_truncated_and_short_files(corpus, tmp_path):
    content = corpus["conv_head"]
    for n in (0, 4, 7, 8, 12, len(content) // 2, len(content) - 1):
        path = tmp_path / f"cut{n}.tflite"
        path.write_bytes(content[:n])
        with pytest.raises(ValueError, match=str(path)):
            litert_torch.load(path)


def test_an_absurd_vector_length_is_refused_without_allocating(corpus):
    m = mutations.unpack(corpus["conv_head"])
    content = bytearray(mutations.pack(m))
    # the subgraph's tensor vector: find its length word (the number of tensors) and inflate it
    import struct

    from ai_edge_litert import schema_py_generated as schema

    sg = schema.Model.GetRootAsModel(bytes(content), 0).Subgraphs(0)
    vec = sg._tab.Vector(sg._tab.Offset(4))
    assert struct.unpack_from("<I", content, vec - 4)[0] == sg.TensorsLength()
    struct.pack_into("<I", content, vec - 4, 0x3FFFFFFF)
    with pytest.raises(InvalidModelError, match="runs past the end of the file"):
        EdgeModel(bytes(content))


def test_trailing_bytes_after_a_valid_model_are_harmless(corpus, tmp_path):
    path = tmp_path / "padded.tflite"
    path.write_bytes(corpus["conv_head"] + bytes(8 << 20))
    edge = litert_torch.load(path)
    assert edge.signatures[0].inputs[0].shape == (1, 3, 8, 8)


def _byte_fuzz(corpus, tmp_path, cases: int, seed: int):
    names = sorted(corpus)
    kinds, paths = [], []
    for name in names:  # the undamaged models first: they must verify, load and run
        verify_model(corpus[name])
        (tmp_path / f"{name}.tflite").write_bytes(corpus[name])
        kinds.append("undamaged")
        paths.append(str(tmp_path / f"{name}.tflite"))
    for i in range(cases):
        kind, content = mutations.byte_case(corpus, seed, i)
        path = tmp_path / f"case{i:05d}.tflite"
        path.write_bytes(content)
        kinds.append(kind)
        paths.append(str(path))
    results = run_files(paths, timeout=60 + 10 * cases)
    table = summarize(kinds, results)
    totals = collections.Counter(outcome for outcome, _ in results)
    print(f"\nhostile-file fuzz: {cases} cases, outcomes {dict(totals)}")
    for kind, counts in sorted(table.items()):
        print(f"  {kind:18s} {dict(counts)}")
    assert table["undamaged"] == {"ran": len(names)}, results[: len(names)]
    findings = [
        f"case {i - len(names)} of seed {seed} ({kinds[i]}; mutations.byte_case(corpus, {seed}, "
        f"{i - len(names)})): {results[i][0]}: {results[i][1][:200]}"
        for i in range(len(paths))
        if results[i][0] not in CLEAN_OUTCOMES
    ]
    assert not findings, "\n".join(findings[:10])
    for (outcome, detail), path in zip(results, paths):
        if outcome == "rejected":
            assert path in detail or "TFL3" in detail, detail  # the error names the file
    return totals


def test_byte_fuzz_never_crashes(corpus, tmp_path):
    totals = _byte_fuzz(corpus, tmp_path, cases=60, seed=10)
    assert totals["rejected"] > 0


@pytest.mark.slow
def test_byte_fuzz_long_run(corpus, tmp_path):
    _byte_fuzz(corpus, tmp_path, cases=int(os.environ.get("RELIABILITY_HOSTILE_CASES", "2000")), seed=11)
