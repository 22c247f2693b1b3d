"""The kernels the interpreter runs here compile for a GPU: every launch of a layer's
forward and backward (split hub rows included), recorded in the interpreter, is compiled
ahead of time for an H100 / H200 (sm_90) down to a cubin, for each config its autotuner
would try (``gpu_compile``). A kernel the GPU compiler refuses fails here, not on the first
launch on a GPU. The whole zoo in four dtypes takes a few minutes: ``SARC_GPU_COMPILE=all``
compiles every case, the default a cross-section (each kernel kind and dtype at least once).
"""
from __future__ import annotations

import os

import pytest
import torch
from triton_check import power_law_block, set_backend
from zoo import LAYERS, features

import sarc
from sarc.backends import triton_runtime

gpu_compile = pytest.importorskip("gpu_compile")

try:
    from triton.backends.compiler import GPUTarget  # noqa: F401
    from triton.backends.nvidia import compiler as _nvidia  # noqa: F401
except ImportError as e:  # an old Triton, or one without its CUDA backend
    pytest.skip(f"Triton cannot compile for CUDA here: {e}", allow_module_level=True)

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


class MathLayer(sarc.Layer):
    """Elementwise math with lowerings of their own (cos, sin, log1p, erf, casts to and from
    half precision) in a message, and a max and a mean reduce."""

    def __init__(self, d: int):
        super().__init__(node={"h": d})

    def message(self, src, dst, edge):
        z = torch.cos(src.h) * torch.sin(dst.h) + torch.log1p(src.h.abs())
        return {"m": z + torch.erf(dst.h).to(torch.bfloat16).type_as(z), "n": z.half().type_as(z)}

    def reduce(self, msg):
        return {"a": sarc.max(msg.m), "b": sarc.mean(msg.n)}

    def update(self, dst, agg):
        return agg.a + agg.b


ALL_LAYERS = {**LAYERS, "math": MathLayer}
CROSS_SECTION = {("math", torch.float16), ("gat_4heads_dropout", torch.bfloat16),
                 ("rgcn_bases", torch.float32)}
"""Each kernel kind once: aggregates (max, mean; split rows and their combine), math and
casts in a region, softmax aggregate, sddmm, unfused edge_softmax, typed linear."""
CASES = sorted(((n, d) for n in ALL_LAYERS for d in DTYPES)
               if os.environ.get("SARC_GPU_COMPILE") == "all" else CROSS_SECTION,
               key=lambda c: (c[0], str(c[1])))


@pytest.fixture
def split_rows(monkeypatch):
    """Rows longer than 8 edges run as segments and a combine kernel: the hub path."""
    monkeypatch.setattr(triton_runtime, "SPLIT_EDGES", 8)


@pytest.mark.parametrize("name,dtype", CASES, ids=lambda c: str(c).removeprefix("torch."))
def test_a_layers_kernels_compile_for_the_gpu(name, dtype, split_rows):
    g = power_law_block(40)
    layer = set_backend(ALL_LAYERS[name](6), "triton").to(dtype)
    feats = {k: v.to(dtype).requires_grad_() if v.is_floating_point() else v
             for k, v in features(layer, g, 6).items()}
    with gpu_compile.record() as rec:
        layer(g, **feats).float().square().sum().backward()
    assert rec.launches
    assert gpu_compile.compile_all(rec) == []


SCHEDULES = ("gat", "gat_attn_drop", "max") if os.environ.get("SARC_GPU_COMPILE") == "all" \
    else ("gat_attn_drop",)


@pytest.mark.parametrize("name", SCHEDULES)
def test_a_schedules_block_kernels_compile_for_the_gpu(tmp_path, name):
    """A one-worker distributed step's kernels: the block ops' (a softmax's statistics in
    float64 over float32 operands, an unfused edge_softmax's site kernels, max partials)."""
    import test_triton_distributed as D
    src, dst, x, label, train = D._graph()
    torch.manual_seed(0)
    state = D._on_triton(D._model(name), name).state_dict()
    out = D._distributed_step(tmp_path, name, state, src, dst, x, label, train, record=True)
    assert out["launches"]
    assert gpu_compile.compile_all(out["launches"]) == []


@pytest.mark.skipif(os.environ.get("SARC_GPU_COMPILE") != "all",
                    reason="random programs' kernels for the GPU: SARC_GPU_COMPILE=all")
def test_random_programs_kernels_compile_for_the_gpu(split_rows):
    """Random DSL programs (``programs.specs``) in float32, bfloat16 and float16, their
    launches gathered over every example and compiled at once."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from programs import features as program_features
    from programs import graphs, make_layer, specs

    jobs: list = []

    @settings(max_examples=int(os.environ.get("SARC_GPU_COMPILE_EXAMPLES", "60")),
              deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(spec=specs(), g=graphs(max_nodes=10, max_edges=24), seed=st.integers(0, 2**16),
           dtype=st.sampled_from(DTYPES[:3]))
    def run(spec, g, seed, dtype):
        torch.manual_seed(seed)
        layer = set_backend(make_layer(spec), "triton").to(dtype)
        feats = {k: v.to(dtype).requires_grad_() if v.is_floating_point() else v
                 for k, v in program_features(layer, g, seed).items()}
        with gpu_compile.record() as rec:
            out = layer(g, **feats)
            sum(o.float().square().sum()
                for o in (out.values() if isinstance(out, dict) else [out])).backward()
        jobs.extend(gpu_compile.jobs(rec))

    run()
    assert jobs
    assert gpu_compile.compile_all(jobs) == []
