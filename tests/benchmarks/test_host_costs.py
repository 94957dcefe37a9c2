"""`benchmarks/device/host_costs.py` on this machine's backend: every figure measured."""

from __future__ import annotations

import json

from benchmarks.device import host_costs


def test_every_cost_is_measured(tmp_path):
    out = tmp_path / "costs.json"
    host_costs.main(["--rounds", "1", "--json", str(out)])
    figures = json.loads(out.read_text())["us_per_call"]
    assert len(figures) == 21 and all(us > 0 for us in figures.values()), figures
    assert {"compiled program, 245 arguments", "d2h a computed scalar, cold", "host: os.stat"} <= set(figures)
