"""The commands README.md and docs/ show in fenced blocks name what exists.

Running every documented command (benchmarks at chip sizes, sweeps of an hour) is no test
for a 2-core CI, but a command that no longer starts is the commonest way a document
lies after code moves: for each `python -m MODULE ...` or `python FILE.py ...` line of a
fenced shell block, the module or file exists, every path argument ending in .py or
naming a tests/ file exists, and every `--option` it passes is an option its source
declares. The python blocks themselves run in tests/test_docs_examples.py.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import shlex

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", *sorted(glob.glob("docs/**/*.md", root_dir=ROOT, recursive=True))]
PYTHON = re.compile(r"(?:^|\s)(?:\S*/)?python3?\s")


def shell_commands(doc: str) -> list[str]:
    """The python command lines of a doc's ```bash and unlabelled fences (continuations joined)."""
    commands, block = [], None
    with open(os.path.join(ROOT, doc)) as f:
        for line in f:
            fence = re.match(r"^\s*```(\w*)\s*$", line)
            if block is None and fence:
                block = [] if fence.group(1) in ("bash", "sh", "") else None
                if block is None:  # another language: skip to its closing fence
                    for inner in f:
                        if inner.strip() == "```":
                            break
                continue
            if block is not None and line.strip() == "```":
                joined = "".join(block).replace("\\\n", " ")
                commands += [c.split("  #")[0].strip() for c in joined.splitlines() if PYTHON.search(c)]
                block = None
            elif block is not None:
                block.append(line)
    return commands


def _source_of(module: str) -> str | None:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    origin = spec.origin
    if origin.endswith("__init__.py") and os.path.exists(os.path.join(os.path.dirname(origin), "__main__.py")):
        origin = os.path.join(os.path.dirname(origin), "__main__.py")
    return origin


CASES = [(doc, command) for doc in DOCS for command in shell_commands(doc)]


def test_the_docs_show_commands():
    assert len(CASES) > 20, "the command finder found almost nothing: its fence parsing broke"


@pytest.mark.parametrize("doc, command", CASES, ids=[f"{d}:{i}" for i, (d, _) in enumerate(CASES)])
def test_documented_command_names_what_exists(doc, command):
    words = shlex.split(command.split("&&")[-1].replace("$", ""))
    start = next(i for i, w in enumerate(words) if re.fullmatch(r"(?:\S*/)?python3?", w))
    args = words[start + 1 :]
    sources = []
    if args[:1] == ["-m"]:
        module, args = args[1], args[2:]
        if module == "pytest":
            for path in (a.split("::")[0] for a in args if a.startswith("tests")):
                assert os.path.exists(os.path.join(ROOT, path)), f"{doc}: `{command}`: {path} does not exist"
            return
        origin = _source_of(module)
        assert origin is not None, f"{doc}: `{command}`: no module {module}"
        sources.append(origin)
    else:
        script, args = args[0], args[1:]
        assert os.path.exists(os.path.join(ROOT, script)), f"{doc}: `{command}`: {script} does not exist"
        sources.append(os.path.join(ROOT, script))
    sources += [os.path.join(ROOT, a) for a in args if a.endswith(".py")]
    for path in sources:
        assert os.path.exists(path), f"{doc}: `{command}`: {path} does not exist"
    text = "".join(open(path).read() for path in sources)
    for option in (a.split("=")[0] for a in args if a.startswith("--")):
        assert f'"{option}"' in text or f"'{option}'" in text, (
            f"{doc}: `{command}`: {option} is no option of {', '.join(os.path.relpath(s, ROOT) for s in sources)}"
        )
