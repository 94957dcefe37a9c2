"""narrow_int64_indices: int64 indices computed as int32 where exact, the signature untouched."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.converter.lowering.conftest import Fn
from tests.helpers import assert_converts

torch.manual_seed(0)


def ops(edge):
    return edge.ir_model.graphs[0].ops


def pooled_at_argmax(hidden, ids):
    """CLIP's pooling: the hidden state at each row's largest token id (int32 ids, as CLIP casts them)."""
    return hidden[torch.arange(hidden.shape[0]), ids.to(torch.int32).argmax(dim=-1)]


def test_argmax_used_as_an_index_runs_in_int32_and_says_so():
    args = (torch.randn(3, 7, 16), torch.randint(0, 100, (3, 7)))
    with pytest.warns(UserWarning, match="int64 index tensor"):
        edge = assert_converts(Fn(pooled_at_argmax), args)
    arg_max = [op for op in ops(edge) if op.opcode == "ARG_MAX"]
    assert [op.options["outputType"] for op in arg_max] == ["INT32"]
    assert not any(t.dtype == np.int64 for op in ops(edge) for t in op.outputs)
    graph = edge.ir_model.graphs[0]
    assert graph.inputs[1].dtype == np.int64  # the user's input dtype is kept


def test_topk_indices_gathered_need_no_int64_round_trip():
    edge = assert_converts(Fn(lambda x: torch.gather(x, 1, torch.topk(x, 3).indices)), (torch.randn(4, 9),))
    assert not any(t.dtype == np.int64 for op in ops(edge) for t in op.outputs)


def test_index_outputs_keep_int64():
    edge = assert_converts(Fn(lambda x: (x.argmax(dim=-1), torch.topk(x, 2).indices)), (torch.randn(4, 9),))
    assert [t.dtype for t in edge.ir_model.graphs[0].outputs] == [np.int64, np.int64]
