"""A section at the end of pytest's output for lines tests want a reader to see whatever
the flags (`-q`, no `-rA`): e.g. how many kernel points compiled for each TPU chip."""

from __future__ import annotations

import pytest

_LINES: list[str] = []


@pytest.fixture
def report_line():
    """`report_line(text)`: print `text` in the "kernel report" section after the run."""
    return _LINES.append


def pytest_terminal_summary(terminalreporter):
    if _LINES:
        terminalreporter.section("kernel report")
        for line in _LINES:
            terminalreporter.write_line(line)
