"""A softmax-weighted sum fuses into one softmax_aggregate exactly when the weights meet
the value's features as a prefix of them (up to trailing size-1 axes: a score kept with
``keepdim=True``); otherwise the product stays unfused. Either way the compiled layer
computes what plain torch computes (``attention_layers.reference``), output and every
gradient equal to the interpreter's."""
from __future__ import annotations

import pytest
import torch
from attention_layers import SCORES, ScoreShapes, reference
from difftest import assert_close, check_layer

import sarc
from sarc.compiler import optimize
from sarc.ir.ops import Op

HEADS = CHANNELS = 3  # equal: a wrong alignment of heads and channels would still type-check


def _layer(score: str) -> ScoreShapes:
    torch.manual_seed(0)
    return ScoreShapes(5, HEADS, CHANNELS, score)


@pytest.mark.parametrize("score", sorted(SCORES))
def test_fuses_where_the_weights_prefix_the_value(score):
    ops = [v.op for v in optimize(_layer(score).trace()).values]
    fused = SCORES[score][1]
    assert (Op.SOFTMAX_AGGREGATE in ops) == fused
    assert (Op.EDGE_SOFTMAX in ops) == (not fused)


@pytest.mark.parametrize("score", sorted(SCORES))
def test_compiled_equals_interpreter_and_plain_torch(score):
    gen = torch.Generator().manual_seed(1)
    src, dst = torch.randint(0, 8, (30,), generator=gen), torch.randint(0, 8, (30,), generator=gen)
    g = sarc.Graph.from_edges(src, dst, 9)  # node 8 has no in-edges
    layer = _layer(score)
    h = torch.randn(9, 5, generator=gen)
    out = check_layer(layer, g, {"h": h})
    assert_close(out["h"], reference(layer, src, dst, 9, h).detach(), what="against plain torch")
