"""What the PyG and DGL comparison tests share: graphs, weight copying, the check.

The check (``compare``): a sarc layer and a library layer get the same weights
(the library's own initialization, well conditioned as in training, except that
parameters it sets to zero, such as biases, are drawn at random so that no zero
term hides a mistake), run on the same graph and features, and are compared on

- the output,
- after backpropagating the same random upstream gradient through both, the
  gradient of the input features and of every parameter of both layers (each
  parameter of either side must be mapped to one of the other).

Tolerance, for float32 and whole tensors: ``max|a - b| <= 1e-5 * max|b|``,
``b`` the library's tensor, except that ``max|b|`` is raised to at least 10% of
the largest ``max|b|`` of the same check (so: errors up to 1e-6 of the check's
largest tensor are accepted everywhere). The floor is for tensors that are
zero in exact arithmetic but not in float32, where a relative error means
nothing: GAT's ``att_dst`` gradient is one when every destination's scores lie
in one branch of the leaky relu (the dst term then cancels in the softmax).
Against a float64 run of DGL, both sides return rounding noise there, a few
float32 ulps of the layer's largest gradients (up to ~1e-6 at gradients of ~5),
and sarc's error is of the same size as DGL's own float32 error on every
tensor. A real mistake moves a tensor by a fraction of its own size, far
above 1e-6 of the largest one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from torch import nn

RTOL = 1e-5
FLOOR = 0.1  # of the largest tensor in a check; see the module docstring

Layout = Callable[[torch.Tensor], torch.Tensor]


@pytest.fixture(autouse=True)
def one_thread():
    """Run a test on one intra-op thread (test modules import this fixture).

    The tensors here are tiny, so a second thread only adds synchronization,
    and on a busy machine OpenMP's waiting threads made each op up to ~50x
    slower (0.7 s instead of 0.01 s for one comparison).
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def same(t: torch.Tensor) -> torch.Tensor:
    return t


def transpose(t: torch.Tensor) -> torch.Tensor:
    return t.t()


def assert_all_close(pairs: list[tuple[str, torch.Tensor, torch.Tensor]]) -> None:
    """Each (what, sarc's, library's): ``max|a - b| <= RTOL * max(max|b|, FLOOR * S)``,
    ``S`` the largest ``max|b|`` of all of them."""
    for what, got, want in pairs:
        assert got.shape == want.shape, f"{what}: shape {list(got.shape)} != {list(want.shape)}"
    peak = [want.double().abs().max().item() if want.numel() else 0.0 for _, _, want in pairs]
    floor = FLOOR * max(peak, default=0.0)
    for (what, got, want), m in zip(pairs, peak):
        if want.numel() == 0:
            continue
        err = (got.double() - want.double()).abs().max().item()
        tol = RTOL * max(m, floor)
        assert err <= tol, (f"{what}: max abs error {err:.3e} > {tol:.3e} (max|ref| = {m:.3e}, "
                            f"floor {floor:.3e})")


# --- graphs ----------------------------------------------------------------------------

def graph_cases() -> dict[str, tuple[torch.Tensor, torch.Tensor, int]]:
    """Named (src, dst, num_nodes) edge lists covering the edge cases."""
    gen = torch.Generator().manual_seed(1)
    n = 13
    # Random edges into nodes 0..9 only: 10..12 have no incoming edges; random
    # pairs give some self loops; the repeated tail adds multi-edges.
    src = torch.randint(0, n, (40,), generator=gen)
    dst = torch.randint(0, 10, (40,), generator=gen)
    src = torch.cat([src, src[:6], torch.tensor([3, 3])])
    dst = torch.cat([dst, dst[:6], torch.tensor([3, 3])])

    def t(xs):
        return torch.tensor(xs, dtype=torch.int64)

    return {
        "random": (src, dst, n),
        # star into node 0; node 5 is isolated, nodes 1..4 have no incoming edges
        "zero_in_degree": (t([1, 2, 3, 4]), t([0, 0, 0, 0]), 6),
        "self_loops": (t([0, 1, 2, 3, 4, 0]), t([0, 1, 2, 3, 4, 1]), 5),
        "multi_edges": (t([0, 0, 0, 2, 1, 1, 3, 3]), t([1, 1, 1, 1, 0, 0, 3, 3]), 4),
        "one_node": (t([]), t([]), 1),
        "one_node_self_loop": (t([0]), t([0]), 1),
        "no_edges": (t([]), t([]), 6),
    }


def symmetric(src: torch.Tensor, dst: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each edge u->v together with v->u (a self loop appears twice, as a multi-edge)."""
    return torch.cat([src, dst]), torch.cat([dst, src])


def random_etypes(num_edges: int, num_rels: int) -> torch.Tensor:
    return torch.randint(0, num_rels, (num_edges,))


def relation_mean_norm(dst: torch.Tensor, etype: torch.Tensor, num_rels: int) -> torch.Tensor:
    """norm_e = 1 / |{edges of type etype[e] into dst[e]}|: RGCN's mean per relation."""
    key = dst * num_rels + etype
    counts = torch.bincount(key, minlength=1)
    return 1.0 / counts[key].to(torch.float32)


# --- the comparison --------------------------------------------------------------------

@dataclass
class Pair:
    """A sarc layer, a library layer and how their parameters correspond.

    ``params`` maps each sarc parameter name to the library's name and the
    layout change from the library's tensor to sarc's (linear, so it maps the
    gradients too). ``run_sarc``/``run_lib`` take the input features.
    """

    sarc: nn.Module
    lib: nn.Module
    params: dict[str, tuple[str, Layout]]
    run_sarc: Callable[[torch.Tensor], torch.Tensor]
    run_lib: Callable[[torch.Tensor], torch.Tensor]


def copy_weights(pair: Pair) -> None:
    """The library layer's weights (all-zero ones made random) copied into the sarc layer."""
    sarc_params = dict(pair.sarc.named_parameters())
    lib_params = dict(pair.lib.named_parameters())
    assert set(pair.params) == set(sarc_params), \
        f"unmapped sarc params: {set(sarc_params) ^ set(pair.params)}"
    assert {n for n, _ in pair.params.values()} == set(lib_params), \
        f"unmapped library params: {set(lib_params) - {n for n, _ in pair.params.values()}}"
    with torch.no_grad():
        for p in lib_params.values():
            if not p.any():
                p.copy_(torch.randn(p.shape) * 0.5)
        for name, (lib_name, layout) in pair.params.items():
            target = sarc_params[name]
            value = layout(lib_params[lib_name])
            assert target.shape == value.shape, f"{name}: {target.shape} vs {value.shape}"
            target.copy_(value)


def compare(pair: Pair, x: torch.Tensor) -> None:
    """Same weights, same input: outputs and all gradients agree (see module doc)."""
    copy_weights(pair)
    x_s = x.clone().requires_grad_(True)
    x_l = x.clone().requires_grad_(True)
    out_s = pair.run_sarc(x_s)
    out_l = pair.run_lib(x_l)
    assert out_s.shape == out_l.shape, f"output: shape {list(out_s.shape)} != {list(out_l.shape)}"
    upstream = torch.randn(out_l.shape)
    (out_s * upstream).sum().backward()
    (out_l * upstream).sum().backward()
    checks = [("output", out_s.detach(), out_l.detach()),
              ("grad of the input features", x_s.grad, x_l.grad)]
    sarc_params = dict(pair.sarc.named_parameters())
    lib_params = dict(pair.lib.named_parameters())
    for name, (lib_name, layout) in pair.params.items():
        checks.append((f"grad of {name} (library: {lib_name})", _grad(sarc_params[name]),
                       layout(_grad(lib_params[lib_name]))))
    assert_all_close(checks)


def _grad(p: torch.Tensor) -> torch.Tensor:
    # A parameter the output does not depend on (e.g. a weight on a graph with
    # no edges, in a library that skips the empty product) has no .grad: zero.
    return p.grad if p.grad is not None else torch.zeros_like(p)
