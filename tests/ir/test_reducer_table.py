"""Every reducer has an entry in every backend's table, and the backends agree on it.

The reducers are data (``sarc.ir.reducers.REDUCERS``); each backend implements them in
one table keyed by name. Adding a reducer without a backend's entry fails here, naming
the backend and the reducer. The differential test runs each reducer on a small graph
with empty rows and ties through the interpreter, the PyTorch kernels and the
distributed merge of two edge blocks.
"""
from __future__ import annotations

import inspect

import pytest
import torch

import sarc
from sarc.backends import torch_ops, triton_grad, triton_source
from sarc import compiler
from sarc.backends import registry
from sarc.backends import torch_blocks as DK
from sarc.distributed import merge
from sarc.ir.split import BLOCK_KIND, Aggregate
from sarc.ir import autodiff, interpreter, ops
from sarc.ir.reducers import REDUCE_KINDS, REDUCERS, Reducer, reducer
from sarc.planner import cost

# (backend, table, whether it covers softmax: a fused softmax_aggregate has Triton
# kernels of its own, not an aggregate kernel's identity / combine)
TABLES = [
    ("interpreter (sarc.ir.interpreter.ROW_REDUCE)", interpreter.ROW_REDUCE, True),
    ("PyTorch kernels (sarc.backends.torch_ops.SEGMENT_REDUCE)", torch_ops.SEGMENT_REDUCE, True),
    ("Triton codegen (sarc.backends.triton_source.ROW_REDUCE)", triton_source.ROW_REDUCE, False),
    ("Triton gradients (sarc.backends.triton_grad.EXTRAS)", triton_grad.EXTRAS, True),
    ("distributed merge (sarc.distributed.merge.MERGES)", merge.MERGES, True),
    ("planner cost (sarc.planner.cost.SAVED_BY_REDUCER)", cost.SAVED_BY_REDUCER, True),
    ("autodiff VJP (sarc.ir.autodiff.REDUCE_VJPS)", autodiff.REDUCE_VJPS, True),
    ("distributed block ops (sarc.backends.registry.BLOCK_OPS)", registry.BLOCK_OPS, True),
]


def missing_entries(reducers: dict[str, Reducer]) -> list[str]:
    """'backend: reducer' for each reducer a backend's table lacks."""
    return [f"{backend}: {name}" for backend, table, fused in TABLES
            for name, r in reducers.items() if (r.node_level or fused) and name not in table]


def test_every_backend_implements_every_reducer():
    missing = missing_entries(REDUCERS)
    assert not missing, "reducers without an implementation:\n" + "\n".join(missing)


def test_a_new_reducer_is_reported_for_every_backend():
    prod = Reducer("prod", unit=1.0, linear=False, selects=False, by_degree=False,
                   node_level=True, combine=torch.mul, vjp="-", merge="-")
    missing = missing_entries({**REDUCERS, "prod": prod})
    assert missing == [f"{backend}: prod" for backend, _, _ in TABLES]


def test_tables_name_only_reducers():
    for backend, table, _ in TABLES:
        stray = set(table) - set(REDUCERS) - {"sddmm"}  # Triton's EXTRAS also has the sddmm's
        assert not stray, f"{backend} has entries for unknown reducers {sorted(stray)}"


def test_reduce_kinds_are_the_node_level_reducers():
    assert ops.REDUCE_KINDS is REDUCE_KINDS
    assert REDUCE_KINDS == ("sum", "mean", "max", "min")
    assert "softmax" in REDUCERS and not REDUCERS["softmax"].node_level


def test_properties():
    assert [n for n, r in REDUCERS.items() if r.linear] == ["sum", "mean"]
    assert [n for n, r in REDUCERS.items() if r.selects] == ["max", "min"]
    assert [n for n, r in REDUCERS.items() if r.by_degree] == ["mean"]
    assert all(r.empty == 0.0 for r in REDUCERS.values())
    for r in REDUCERS.values():
        if r.node_level:  # the unit is the combine's identity
            x = torch.tensor([-3.0, 0.0, 2.5])
            assert torch.equal(r.combine(x, torch.full_like(x, r.unit)), x)
    assert BLOCK_KIND == {"mean": "sum"}
    with pytest.raises(ValueError, match="softmax"):
        REDUCERS["softmax"].finalize(torch.zeros(2), torch.ones(2))


def test_unknown_reducer_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown reduction 'prod'; expected one of sum, mean"):
        reducer("prod")


# --- the backend interface ----------------------------------------------------------------

def missing_members(backend: registry.Backend) -> list[str]:
    """What ``backend`` lacks of the interface: a field, a block op of a reducer (or of an
    unfused edge_softmax) or a method of its edge lowering."""
    missing = [f"{backend.name}: {f}" for f in ("passes", "compile", "blocks", "edge_lowering")
               if getattr(backend, f, None) is None]
    for name in REDUCERS:
        for op in registry.BLOCK_OPS.get(name, ()):
            if not callable(getattr(backend.blocks, op, None)):
                missing.append(f"{backend.name}: block op {op} of reducer {name}")
    for op in registry.SITE_OPS:
        if not callable(getattr(backend.blocks, op, None)):
            missing.append(f"{backend.name}: block op {op} of edge_softmax")
    edge = compiler.optimize(_sum_layer().trace())
    lowering = backend.edge_lowering(edge, "probe")
    for member in ("lower", "block_op", "ops"):
        if not callable(getattr(lowering, member, None)):
            missing.append(f"{backend.name}: edge lowering's {member}")
    for member in ("fallbacks", "op_lines"):
        if not isinstance(getattr(lowering, member, None), list):
            missing.append(f"{backend.name}: edge lowering's {member}")
    return missing


def _sum_layer():
    from gcn import GCNLayer
    return GCNLayer(4, 3)


@pytest.mark.parametrize("name", registry.BACKENDS)
def test_every_backend_implements_the_interface(name):
    backend = registry.get_backend(name)
    assert backend.name == name and registry.get_backend(name) is backend
    assert all(callable(p) for p in backend.passes) and callable(backend.compile)
    missing = missing_members(backend)
    assert not missing, "backend members missing:\n" + "\n".join(missing)


@pytest.mark.parametrize("name", registry.BACKENDS)
def test_block_ops_have_the_torch_backends_signature(name):
    """The torch block op's parameters; a site op (``SITE_OPS``) may take the backend's
    compiled op after them, with a default (``registry.EdgeLowering.block_op``), so the torch
    call form still calls it."""
    blocks = registry.get_backend(name).blocks
    for op in {op for ops in registry.BLOCK_OPS.values() for op in ops} | set(registry.SITE_OPS):
        want = list(inspect.signature(getattr(DK, op)).parameters)
        got = inspect.signature(getattr(blocks, op)).parameters
        assert list(got)[:len(want)] == want, f"{name}: block op {op} differs from torch_blocks.{op}"
        extra = list(got.values())[len(want):]
        assert op in registry.SITE_OPS or not extra, f"{name}: block op {op} takes more"
        assert all(p.default is not inspect.Parameter.empty for p in extra), \
            f"{name}: block op {op}'s extra parameters need defaults"


def test_a_backend_without_a_block_op_is_reported():
    torch_backend = registry.get_backend("torch")
    blocks = type(DK)("blocks_without_select")
    for op in {op for ops in registry.BLOCK_OPS.values() for op in ops} | set(registry.SITE_OPS):
        if op != "extremum_select":
            setattr(blocks, op, getattr(DK, op))
    lacking = registry.Backend("lacking", (), torch_backend.compile, blocks,
                               torch_backend.edge_lowering)
    assert missing_members(lacking) == ["lacking: block op extremum_select of reducer max",
                                        "lacking: block op extremum_select of reducer min"]


def test_an_unknown_backend_names_the_available_ones():
    with pytest.raises(registry.UnknownBackend,
                       match="unknown backend 'cuda'; available: torch, triton"):
        registry.get_backend("cuda")
    with pytest.raises(ValueError, match="unknown backend 'cuda'; available: torch, triton"):
        compiler.compile_layer(_sum_layer().trace(), "cuda")


# --- the backends agree ------------------------------------------------------------------

NUM_NODES, EMPTY = 9, (2, 7, 8)


def _graph(gen) -> sarc.Graph:
    rows = torch.tensor([v for v in range(NUM_NODES) if v not in EMPTY])
    dst = rows[torch.randint(0, len(rows), (40,), generator=gen)]
    src = torch.randint(0, NUM_NODES, (40,), generator=gen)
    return sarc.Graph.from_edges(src, dst, NUM_NODES)


def _rows(r: Reducer, g: sarc.Graph, gen) -> list[torch.Tensor]:
    """Edge rows with many ties (small integers); softmax reads (score, value)."""
    def ties(*feat):
        return torch.randint(-2, 3, (g.num_edges, *feat), generator=gen).double()
    if r.name == "softmax":
        return [ties(2), torch.randn(g.num_edges, 2, 3, generator=gen, dtype=torch.float64)]
    return [ties(3)]


def _partial(name: str, block: sarc.Graph, rows: list[torch.Tensor]):
    """A block's partial, as the distributed edge part computes it."""
    if name == "softmax":
        return DK.softmax_partial(lambda gb, s, v: s, lambda gb, s, v: v, ("edge", "edge"), 8,
                                  block, None, *rows)
    if reducer(name).selects:
        return DK.reduce_extremum_partial(name, rows[0], block)
    return torch_ops.segment_reduce(BLOCK_KIND.get(name, name), rows[0], block)


@pytest.mark.parametrize("name", list(REDUCERS))
def test_interpreter_torch_ops_and_merged_blocks_agree(name):
    r = REDUCERS[name]
    gen = torch.Generator().manual_seed(7)
    g = _graph(gen)
    rows = _rows(r, g, gen)
    ref_in = [x.clone().requires_grad_() for x in rows]
    got_in = [x.clone().requires_grad_() for x in rows]
    want = interpreter.ROW_REDUCE[name](g, *ref_in)
    got = torch_ops.SEGMENT_REDUCE[name](g, *got_in)
    torch.testing.assert_close(got, want)
    empty = torch.tensor(EMPTY)
    assert torch.equal(want[empty], torch.full_like(want[empty], r.empty))

    # gradients, with a cotangent of both signs (torch's own max / min backward splits
    # ties only where it is positive)
    ct = torch.randn(want.shape, generator=gen, dtype=want.dtype)
    for a, b in zip(torch.autograd.grad(got, got_in, ct), torch.autograd.grad(want, ref_in, ct)):
        torch.testing.assert_close(a, b)

    # two blocks over the same destinations, merged
    owner = torch.randint(0, 2, (g.num_edges,), generator=gen)
    rule = merge.make_merge(Aggregate("$a0", name, 0, tuple(want.shape[1:]),
                                      tuple(rows[0].shape[1:])), g.in_degree.double())
    for b in range(2):
        idx = (owner == b).nonzero().squeeze(1)
        block = sarc.Graph.from_edges(g.src[idx], g.dst[idx], NUM_NODES)
        rule.add(_partial(name, block, [x[idx].index_select(0, block.perm) for x in rows]))
    merged = rule.finish(torch.zeros_like(want))
    torch.testing.assert_close(merged, want.detach())
    assert torch.equal(merged[empty], torch.full_like(merged[empty], r.empty))
