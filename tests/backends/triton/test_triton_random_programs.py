"""Property test: the Triton backend == the PyTorch backend on random DSL programs.

Programs from ``programs.specs`` (gathers, elementwise math, linear maps, typed
linears, concatenations, parameters broadcast against edge values, every reduce
kind, edge_softmax) on random small graphs. Ops the backend cannot lower run
with an explicit fallback (``TritonKernel.fallbacks``), which this test allows:
it checks that whatever runs, runs right. Kept small: the kernels run in
Triton's interpreter.
"""
from __future__ import annotations

import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from programs import MAX_OF_A_F64_REGION, features, graphs, make_layer, specs
from triton_check import compare

import sarc

_SELF_LOOP = sarc.Graph.from_edges(torch.tensor([0]), torch.tensor([0]), num_src=1, num_dst=1)


@settings(max_examples=int(__import__("os").environ.get("SARC_TRITON_EXAMPLES", "20")),
          deadline=None)
@given(spec=specs(), g=graphs(max_nodes=10, max_edges=24), seed=st.integers(0, 2**16))
@example(spec=MAX_OF_A_F64_REGION, g=_SELF_LOOP, seed=2)   # its max's gradient was 0
def test_random_programs(spec, g, seed):
    torch.manual_seed(seed)
    layer = make_layer(spec)
    compare(layer, g, features(layer, g, seed), rtol=1e-4, allow_fallback=True)
