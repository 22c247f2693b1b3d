"""Offsets past 2^31 elements: an input's feature index times its stride is computed in 64
bits. A column-major feature matrix (``torch.from_numpy`` of a Fortran-order array, ``X.t()``)
of 20M rows has a feature stride of 20M, and its column 108 starts past 2^31 elements;
Triton passes a stride that fits 32 bits as int32, so an int32 index times it wraps and
reads before the tensor (an illegal access on a GPU, garbage in the interpreter).

The inputs here are views of a large buffer that is never touched but where they lie
(lazily allocated: ~0.4 GiB resident), with a feature stride just under 2^31, so column 2
is at 2^32 - 16 elements."""
from __future__ import annotations

import pytest
import torch
from triton_check import set_backend

import sarc

STRIDE = 2**31 - 8   # fits int32; 2 * STRIDE wraps to -16 in int32
N, F = 5, 3


class Sum(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": sarc.Feature((F,), "f16")})

    def message(self, src, dst, edge):
        return src.h * dst.h.sum(-1, keepdim=True)

    def reduce(self, msg):
        return sarc.sum(msg.m)


class Typed(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": sarc.Feature((F,), "f16")}, edge={"etype": sarc.INDEX})
        self.rel = sarc.TypedLinear(F, 4, 2).half()

    def message(self, src, dst, edge):
        return self.rel(src.h, edge.etype)

    def reduce(self, msg):
        return sarc.sum(msg.m)


@pytest.fixture(scope="module")
def column_major():
    """[N, F] float16 with strides (1, STRIDE); the 16 elements before it (where a wrapped
    offset lands) hold 999."""
    base = torch.empty(16 + 2 * STRIDE + N + 16, dtype=torch.float16)
    base[:16 + N] = 999.0
    x = base.as_strided((N, F), (1, STRIDE), storage_offset=16)
    for c in range(F):
        x[:, c] = torch.arange(N, dtype=torch.float16) / 4 + c
    return x


@pytest.mark.parametrize("make", [Sum, Typed], ids=["aggregate", "typed_linear"])
def test_a_feature_offset_past_2_31_elements_reads_the_input(make, column_major):
    torch.manual_seed(0)
    g = sarc.Graph.from_edges(torch.tensor([0, 1, 2, 3, 4, 0]), torch.tensor([1, 2, 3, 4, 0, 0]), N)
    feats = {"h": column_major}
    if make is Typed:
        feats["etype"] = torch.tensor([0, 1, 0, 1, 1, 0])
    ref_layer = set_backend(make(), "torch")
    layer = set_backend(make(), "triton")
    layer.load_state_dict(ref_layer.state_dict())
    ref, out = ref_layer(g, **feats), layer(g, **feats)
    assert (out.float().abs() < 100).all(), out   # 999 is what lies before the input
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-3, atol=2e-3)
    if make is Typed:   # the weight gradient reads the input again (typed_outer)
        (ref.float() ** 2).sum().backward()
        (out.float() ** 2).sum().backward()
        torch.testing.assert_close(layer.rel.weight.grad.float(), ref_layer.rel.weight.grad.float(),
                                   rtol=2e-3, atol=2e-2)
