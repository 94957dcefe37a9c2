"""Custom ops standing for one LiteRT builtin (`converter/lowering/litert_ops.py`): the
eager kernel and the converted DYNAMIC_UPDATE_SLICE agree exactly, the start offsets
given at run time, clamped ones included."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import litert_torch
from converter.lowering.litert_ops import dynamic_update_slice
from tests.converter.lowering.conftest import Fn


def test_dynamic_update_slice_matches_litert_at_run_time_offsets():
    operand, update = torch.randn(1, 2, 10, 4), torch.randn(1, 2, 3, 4)
    edge = litert_torch.convert(
        Fn(lambda x, u, s: dynamic_update_slice(x, u, s) * 2.0), (operand, update, torch.zeros(4, dtype=torch.int32))
    )
    assert [op.opcode for op in edge.ir_model.graphs[0].ops] == ["DYNAMIC_UPDATE_SLICE", "MUL"]
    for first in (0, 4, 7, 9, -2):  # 9 and -2 are clamped to 7 and 0, in LiteRT and eagerly alike
        start = torch.tensor([0, 0, first, 0], dtype=torch.int32)
        expected = dynamic_update_slice(operand, update, start) * 2.0
        np.testing.assert_array_equal(edge(operand, update, start), expected.numpy())
        at = min(max(first, 0), 7)
        torch.testing.assert_close(expected[:, :, at : at + 3], 2.0 * update, rtol=0, atol=0)


def test_dynamic_update_slice_checks_its_start_vector():
    with pytest.raises(ValueError, match="one offset per axis"):
        dynamic_update_slice(torch.zeros(2, 3), torch.zeros(1, 3), torch.zeros(1, dtype=torch.int32))
