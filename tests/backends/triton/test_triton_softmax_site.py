"""An unfused edge_softmax's block ops on the Triton backend's kernels
(``triton_blocks`` given a ``SoftmaxSiteOp``) equal the torch backend's, and their two
passes' shares of the score gradient add up to the softmax's gradient over the whole graph:
edges dealt at random into blocks (each row's edges across blocks), rows without edges, a
hub longer than ``SPLIT_EDGES`` (one program walks it whole), in float32, float64 and
bfloat16."""
from __future__ import annotations

import pytest
import torch
from gat import GATLayer

import sarc
from sarc.backends import torch_blocks, triton_backend, triton_blocks
from sarc.backends.triton_runtime import SPLIT_EDGES, SoftmaxSiteOp
from sarc.compiler import compile_layer
from sarc.distributed.merge import NormalizerMerge, SiteShares
from sarc.ir.ops import Op

HEADS, ROWS, BLOCKS = 2, 9, 3


def _site_op() -> SoftmaxSiteOp:
    """The site op of a GAT layer with attention dropout (an unfused edge_softmax)."""
    fn = compile_layer(GATLayer(3, 2, heads=HEADS, attn_drop=0.5).trace(), "triton",
                       through="optimize").optimized
    i = next(k for k, v in enumerate(fn.values) if v.op is Op.EDGE_SOFTMAX)
    plan, spec = triton_backend.plan_softmax_site(fn, i)
    (op,) = triton_backend.load_ops(fn, [(i, spec, fn.values[i].type.dtype)], plan.kernels)
    assert isinstance(op, SoftmaxSiteOp)
    return op


def _graph(gen) -> sarc.Graph:
    """Destinations sorted (CSR order); rows 0 and ROWS - 1 have no edges, row 1 is a hub."""
    dst = torch.cat([torch.ones(SPLIT_EDGES + 40, dtype=torch.int64),
                     torch.randint(2, ROWS - 1, (60,), generator=gen)]).sort().values
    return sarc.Graph.from_edges(torch.zeros_like(dst), dst, num_src=1, num_dst=ROWS,
                                 dst_in_src=False)


def _block(g: sarc.Graph, idx: torch.Tensor) -> sarc.Graph:
    return sarc.Graph.from_edges(torch.zeros(idx.numel(), dtype=torch.int64), g.dst[idx],
                                 num_src=1, num_dst=g.num_dst, dst_in_src=False)


def _close(got, want, dtype, what):
    tol = {torch.float64: 1e-12, torch.float32: 2e-6, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(got, want, rtol=tol, atol=tol * float(want.abs().max()) + 1e-30,
                               msg=lambda m: f"{what}: {m}")


@pytest.fixture(scope="module")
def site_op():
    return _site_op()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_site_block_ops_equal_the_torch_backends(site_op, dtype):
    gen = torch.Generator().manual_seed(7)
    g = _graph(gen)
    sc = (torch.randn(g.num_edges, HEADS, generator=gen, dtype=torch.float64) * 4).to(dtype)
    owner = torch.randint(0, BLOCKS, (g.num_edges,), generator=gen)
    blocks = [(idx, _block(g, idx)) for idx in
              ((owner == b).nonzero().squeeze(1) for b in range(BLOCKS))]

    # the normalizer pass: (m, s) per block, merged over the blocks
    merge = NormalizerMerge(g.in_degree)
    for idx, gb in blocks:
        m, s = triton_blocks.score_normalizer(sc[idx], gb, site_op)
        m_t, s_t = torch_blocks.score_normalizer(sc[idx], gb)
        assert m.dtype == m_t.dtype and torch.equal(m, m_t)
        assert s.dtype == torch.float64
        _close(s, s_t, torch.float64, "block sums")
        merge.add((m, s))
    big_m, big_s = merge.finish((ROWS, HEADS), dtype, "cpu")

    # the main pass: global weights, the score gradient's first share and B per block
    cot = torch.randn(g.num_edges, HEADS, generator=gen, dtype=torch.float64).to(dtype)
    shares, first = SiteShares(ROWS), torch.zeros(g.num_edges, HEADS, dtype=torch.float64)
    for k, (idx, gb) in enumerate(blocks):
        got, want = [], []
        for op, out in ((site_op, got), (None, want)):
            x = sc[idx].clone().requires_grad_()
            s_leaf = big_s.clone().requires_grad_()
            alpha = triton_blocks.edge_softmax_global(x, gb, (big_m, s_leaf), op)
            out += [alpha.detach(), *torch.autograd.grad(alpha, [x, s_leaf], cot[idx])]
        for a, b, what in zip(got, want, ("weights", "score gradient", "B")):
            assert a.dtype == b.dtype, what
            _close(a, b, dtype if what != "B" else torch.float64, what)
        first[idx] = got[1].double()
        shares.add(k, got[2], None)

    # the normalizer pass's share, from (gbar, B_j)
    second = torch.zeros_like(first)
    for k, (idx, gb) in enumerate(blocks):
        grads = []
        for op in (site_op, None):
            x = sc[idx].clone().requires_grad_()
            sur = triton_blocks.score_normalizer_surrogate(
                x, gb, (big_m, big_s), shares.at(k, None, big_s), op)
            grads.append(torch.autograd.grad(sur.sum(), x)[0])
        _close(grads[0], grads[1], dtype, "the normalizer pass's score gradient")
        second[idx] = grads[0].double()

    # both shares: the softmax's gradient over each row's edges in every block
    x = sc.double().requires_grad_()
    m = torch.segment_reduce(x.detach(), "max", offsets=g.rowptr, axis=0)
    ex = torch.exp(x - m[g.dst])
    alpha = ex / torch.zeros(ROWS, HEADS, dtype=torch.float64).index_add(0, g.dst, ex)[g.dst]
    (want,) = torch.autograd.grad(alpha, x, cot.double())
    tol = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(first + second, want, rtol=tol, atol=tol * float(want.abs().max()))


def test_no_block_op_of_the_triton_backend_falls_back():
    assert triton_blocks.FALLBACKS == {}
