"""Launch grids stay within CUDA's limits for any graph size: 2^31 - 1 programs on grid
axis 0, 65535 on axes 1 and 2. RGCN's typed product on 8M node x relation rows once asked
for ~250k programs on axis 1 ("invalid argument" on an H100); its row blocks are axis 0."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

import sarc
from sarc.backends import codegen
from zoo import LAYERS

AXIS0, OTHER = 2**31 - 1, 65535


def _typed_linear_module():
    layer = LAYERS["rgcn"](8).set_backend("triton")
    kernel = layer.compiled()
    src = next(k for k in kernel.kernels if "typed_linear" in k.source and "def grid" in k.source)
    _, module = codegen.load_module(f"grid_check_{abs(hash(src.source))}", src.source)
    return module


@pytest.mark.parametrize("rows,types,n", [(8_000_000, 8, 128), (2**28, 90, 512), (10, 1, 16),
                                          (1000, 70_000, 16)])
def test_typed_linear_grid_fits_cuda_limits(rows, types, n):
    module = _typed_linear_module()
    groups = SimpleNamespace(max_count=rows, num_types=types)
    for config in module.CONFIGS:
        g = module.grid(groups, n, config.kwargs)
        assert g[0] <= AXIS0 and g[1] <= OTHER and g[2] <= OTHER, (config.kwargs, g)
        # every row of every type is covered
        assert g[0] >= types * -(-rows // config.kwargs["BLOCK_M"]), (config.kwargs, g)


def test_autotuning_is_persisted_where_triton_can():
    """The autotuner keeps its choices on disk (Triton >= 3.2's ``cache_results``), so a
    second process does not benchmark every config again."""
    import inspect

    import triton

    from sarc.backends.triton_runtime import persisted
    if "cache_results" in inspect.signature(triton.autotune).parameters:
        assert persisted() == {"cache_results": True}
        triton.autotune(configs=[triton.Config({})], key=[], **persisted())  # accepted
    else:
        assert persisted() == {}


# --- tiles as wide as the features --------------------------------------------------------

@pytest.mark.parametrize("width", [2, 3, 7, 8, 16, 31, 32, 33, 64, 100, 257])
@pytest.mark.parametrize("heads", [1, 4])
def test_autotuned_tiles_are_no_wider_than_the_features(heads, width):
    """Every config the autotuner keeps for a kernel tiling a feature axis of D elements
    has BLOCK_D <= max(16, pow2(D)), for every degree bucket: a 7-class output head is not
    run in tiles 64 features wide with 57 of them padding."""
    from sarc.backends.triton_lower import pow2
    from sarc.backends.triton_runtime import _prune
    from gat import GATLayer
    layer = GATLayer(12, width, heads=heads, attn_drop=0.3).set_backend("triton")  # + sddmm
    tiled = 0
    for k in layer.compiled().kernels:
        _, module = codegen.load_module(f"tiles_{abs(hash(k.source))}", k.source)
        d = getattr(module, "D", 1)
        if d <= 1 or not any("BLOCK_D" in c.kwargs for c in module.CONFIGS):
            continue
        tiled += 1
        for max_deg in ((16, 128, 1024) if "MAX_DEG" in module.KEY else (None,)):
            args = {"D": d, **({"MAX_DEG": max_deg} if max_deg else {})}
            for c in _prune(module.CONFIGS, args):
                assert c.kwargs["BLOCK_D"] <= max(16, pow2(d)), (k.name, d, c.kwargs)
    assert tiled
