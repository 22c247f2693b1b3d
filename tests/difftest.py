"""Differential testing: a compiled layer against the reference interpreter.

``check_layer`` runs a layer twice on the same graph and features: through the
backend (``layer(g, ...)``, optimized IR, generated code) and through
``sarc.ir.interpreter`` on the layer's *traced* IR (before any pass), then
compares the outputs and the gradients of every parameter and every float
feature under one random cotangent. ``assert_close`` compares whole tensors by
relative error, ``max|a - b| / max|b|``.
"""
from __future__ import annotations

from typing import Mapping

import pytest
import torch

import sarc
from sarc.ir import interpreter
from sarc.runtime.bind import bind_inputs


def _triton_problem() -> str | None:
    from sarc.backends import triton_backend
    try:
        triton_backend.check_triton()
    except triton_backend.TritonUnavailable as e:
        return str(e)
    return None


TRITON_PROBLEM = _triton_problem()
TRITON = pytest.param("triton", marks=pytest.mark.skipif(
    TRITON_PROBLEM is not None, reason=f"no Triton backend here: {TRITON_PROBLEM}"))
"""The Triton backend as a test parameter: skipped, with the reason, where it cannot run
(the DGL environment's triton 2.2)."""
BACKENDS = ("torch", TRITON)

RTOL = 1e-5
# A gradient that cancels to (nearly) zero -- GAT's att_dst when all of a node's
# scores fall on one side of the leaky_relu, an attention over scores that are equal
# for every edge into a node -- is float32 rounding noise in both implementations,
# a few ulps of the layer's larger terms (checked against a float64 run of the
# interpreter). So is an output that cancels (a sum over edges of theta h_u - theta h_v
# whose two ends are nearly equal) where the two round its terms in different orders,
# and the gradient of such a theta. Each gradient is measured against at least this
# fraction of the largest output or gradient of the layer: noise up to rtol * 0.1 of
# that passes. An output is measured so only where it is also no further from the
# float64 interpreter's than the float32 interpreter's is (``_close_or_no_further``).
CANCEL_FLOOR = 0.1
DROPOUT_SEED = 1234


def assert_close(actual: torch.Tensor, expected: torch.Tensor, rtol: float = RTOL,
                 what: str = "", floor: float = 0.0) -> None:
    """``max|actual - expected| <= rtol * max(max|expected|, floor)`` over the whole tensor.

    ``floor`` is for values that cancel to (nearly) zero, which float32 cannot give
    to a relative accuracy: they are compared at the scale of their terms.
    """
    where = f"{what}: " if what else ""
    assert actual.shape == expected.shape, f"{where}shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{where}dtype {actual.dtype} != {expected.dtype}"
    if expected.numel() == 0:
        return
    a, b = actual.detach().double(), expected.detach().double()
    assert torch.isfinite(b).all(), f"{where}the reference has non-finite entries"
    assert torch.isfinite(a).all(), f"{where}non-finite entries where the reference has none"
    diff = (a - b).abs().max().item()
    scale = max(b.abs().max().item(), floor)
    assert diff <= rtol * scale, (f"{where}max abs diff {diff:.3e} > {rtol:g} * max abs "
                                  f"{scale:.3e} (relative {diff / scale if scale else float('inf'):.3e})")


def _as_dict(out, fn) -> dict[str, torch.Tensor]:
    if isinstance(out, Mapping):
        return dict(out)
    (name, _), = fn.outputs
    return {name: out}


def _maxabs(t: torch.Tensor) -> float:
    return t.detach().abs().max().item() if t.numel() else 0.0


def _fresh(feats: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().requires_grad_(v.is_floating_point()) for k, v in feats.items()}


def _grads(outs: Mapping[str, torch.Tensor], cot: Mapping[str, torch.Tensor],
           wrt: list[torch.Tensor]) -> list[torch.Tensor]:
    loss = sum((outs[k] * cot[k]).sum() for k in sorted(outs))
    if not loss.requires_grad:
        return [torch.zeros_like(w) for w in wrt]
    gs = torch.autograd.grad(loss, wrt, allow_unused=True)
    return [torch.zeros_like(w) if gr is None else gr for w, gr in zip(wrt, gs)]


def reference(layer: sarc.Layer, g: sarc.Graph, feats: Mapping[str, torch.Tensor],
              fn=None) -> dict[str, torch.Tensor]:
    """The interpreter's outputs for ``layer`` (traced IR unless ``fn`` is given)."""
    fn = layer.trace() if fn is None else fn
    inputs = bind_inputs(layer, fn, g, (), feats)
    return interpreter.run(fn, g, inputs, layer.leaf_tensors(), layer.training)


class _Float64Truth:
    """The float64 interpreter's outputs and gradients, run once and only when asked.

    A value that cancels -- an output ``log(sigmoid(x) + 0.5)``, a log of nearly 1; a
    parameter's gradient summed over terms much larger than itself, as ``theta h_u -
    theta h_v`` into a hub of equal sources gives -- differs from the interpreter's by
    float32's rounding of its terms, beyond ``rtol`` of its own size. It passes where it
    is no further from the float64 interpreter's than the float32 interpreter's own is
    (twice, and ``rtol`` of the larger of its size and the floor).
    """

    def __init__(self, layer, g, feats, cot, float_feats: list[str]):
        self._args = layer, g, feats, cot, float_feats
        self._outs: dict[str, torch.Tensor] = {}
        self._grads: list[torch.Tensor] = []

    def _run(self) -> None:
        import copy
        layer, g, feats, cot, float_feats = self._args
        wide = copy.deepcopy(layer).double()
        fw = _fresh({k: v.double() if v.is_floating_point() else v for k, v in feats.items()})
        torch.manual_seed(DROPOUT_SEED)          # the same dropout masks
        outs = reference(wide, g, fw)
        params = [p for _, p in wide.named_parameters() if p.requires_grad]
        self._grads = _grads(outs, {k: v.double() for k, v in cot.items()},
                             params + [fw[k] for k in float_feats])
        self._outs = {k: v.detach() for k, v in outs.items()}

    def output(self, name: str) -> torch.Tensor:
        if not self._outs:
            self._run()
        return self._outs[name]

    def grad(self, i: int) -> torch.Tensor:
        if not self._outs:
            self._run()
        return self._grads[i].detach()


def _close_or_no_further(what: str, got: torch.Tensor, want: torch.Tensor, truth,
                         rtol: float, floor: float = 0.0,
                         truth_floor: float | None = None) -> None:
    """``assert_close`` (at ``floor``), or else no further from the float64 ``truth()``
    than ``want`` is (at ``truth_floor``, by default ``floor``)."""
    try:
        assert_close(got, want, rtol, what, floor)
        return
    except AssertionError as e:
        if got.shape != want.shape or got.dtype != want.dtype or not torch.isfinite(got).all():
            raise
        first = e
    exact = truth()
    err_got = float((got.detach().double() - exact).abs().max())
    err_want = float((want.detach().double() - exact).abs().max())
    scale = max(float(exact.abs().max()), floor if truth_floor is None else truth_floor)
    assert err_got <= 2 * err_want + rtol * scale, (
        f"{first}; and {err_got:.3e} from the float64 interpreter's, where the float32 "
        f"interpreter's is {err_want:.3e} (scale {scale:.3e})")


def check_layer(layer: sarc.Layer, g: sarc.Graph, feats: Mapping[str, torch.Tensor],
                rtol: float = RTOL) -> dict[str, torch.Tensor]:
    """Assert compiled == interpreter for outputs and all gradients; returns the outputs."""
    fn = layer.trace()
    params = [(n, p) for n, p in layer.named_parameters() if p.requires_grad]

    # A training call draws its dropout seed from torch's RNG (sarc.ir.rng): reseeding
    # before each run gives the compiled code and the interpreter the same masks.
    fc = _fresh(feats)
    torch.manual_seed(DROPOUT_SEED)
    out_c = _as_dict(layer(g, **fc), fn)
    fr = _fresh(feats)
    torch.manual_seed(DROPOUT_SEED)
    out_r = reference(layer, g, fr, fn)

    assert sorted(out_c) == sorted(out_r)
    cot = {k: torch.randn_like(v) for k, v in out_r.items()}
    names = [f"param {n}" for n, _ in params]
    float_feats = [k for k in sorted(feats) if feats[k].is_floating_point()]
    names += [f"feature {k}" for k in float_feats]
    gc = _grads(out_c, cot, [p for _, p in params] + [fc[k] for k in float_feats])
    gr = _grads(out_r, cot, [p for _, p in params] + [fr[k] for k in float_feats])
    floor = CANCEL_FLOOR * max([_maxabs(t) for t in gr] + [_maxabs(t) for t in out_r.values()])
    truth = _Float64Truth(layer, g, feats, cot, float_feats)
    for k in out_r:
        _close_or_no_further(f"output {k!r}", out_c[k], out_r[k], lambda k=k: truth.output(k),
                             rtol, truth_floor=floor)
    for i, (name, a, b) in enumerate(zip(names, gc, gr)):
        _close_or_no_further(f"grad of {name}", a, b, lambda i=i: truth.grad(i), rtol, floor)
    return out_c


def block(src, dst, num_src: int, num_dst: int | None = None) -> sarc.Graph:
    """A graph (``num_dst`` None) or block from python lists of edges."""
    src = torch.tensor(src, dtype=torch.int64)
    dst = torch.tensor(dst, dtype=torch.int64)
    if num_dst is None:
        return sarc.Graph.from_edges(src, dst, num_src)
    return sarc.Graph.from_edges(src, dst, num_src=num_src, num_dst=num_dst)


def random_block(gen: torch.Generator, num_src: int, num_dst: int, num_edges: int) -> sarc.Graph:
    src = torch.randint(0, num_src, (num_edges,), generator=gen)
    dst = torch.randint(0, num_dst, (num_edges,), generator=gen) if num_dst else src[:0]
    return sarc.Graph.from_edges(src, dst, num_src=num_src, num_dst=num_dst)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Run a test on one intra-op thread (an autouse fixture: test modules import it).

    The test graphs are tiny: a second OpenMP thread only adds synchronization, and on
    a loaded machine that costs milliseconds per sparse matmul -- most of the suite's
    time. Restored after the test.
    """
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class Apply(sarc.Layer):
    """A layer whose ``update`` returns ``fn(self, h)`` for each node (``reduce`` hands it its
    own h over self loops): a function of a per-node value, traced inside a layer."""

    def __init__(self, fn, width=8, module: torch.nn.Module | None = None):
        super().__init__(node={"h": width})
        self.fn, self.mod = fn, module

    def message(self, src, dst, edge):
        return src.h

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, dst, agg):
        return self.fn(self, agg.agg)
