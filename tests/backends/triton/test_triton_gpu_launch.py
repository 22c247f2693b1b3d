"""The launch path a GPU takes (``triton_runtime.run`` when the kernel is not interpreted:
``triton.autotune`` over the module's CONFIGS, ``_prune`` on the named arguments, the grid
lambdas on the chosen config), run here by Triton's own ``Autotuner`` around the
interpreted kernels: ``interpreted`` says False, ``check_device`` lets CPU tensors through,
and the benchmark runs each kept config once (no GPU timer) instead of timing it. A layer
so launched equals the PyTorch backend, outputs and every gradient, though every config the
autotuner tries has written its outputs before the one chosen runs again."""
from __future__ import annotations

import pytest
import torch
from difftest import random_block
from triton_check import compare, power_law_block
from zoo import LAYERS, features

from sarc.backends import triton_runtime


@pytest.fixture
def gpu_launch(monkeypatch):
    """``run`` takes its GPU branch; returns the autotuners made and the configs benched."""
    import triton

    made, benched = [], []
    real = triton.autotune

    def autotune(*, configs, key, prune_configs_by=None, **kw):
        def bench(fn, quantiles=None):
            fn()  # the launch of one config: its outputs written, as a GPU's timing runs do
            benched.append(fn)
            t = float(len(benched))
            return [t, t, t]
        deco = real(configs=configs, key=key, prune_configs_by=prune_configs_by,
                    do_bench=bench, **kw)

        def wrap(kernel):
            tuner = deco(kernel)
            made.append(tuner)
            return tuner
        return wrap

    monkeypatch.setattr(triton, "autotune", autotune)
    monkeypatch.setattr(triton_runtime, "interpreted", lambda kernel: False)
    monkeypatch.setattr(triton_runtime, "check_device", lambda *a: None)
    monkeypatch.setattr(triton_runtime, "_TUNED", {})
    # small buckets and split rows, so that a 48-node graph has every kind of work item
    monkeypatch.setattr(triton_runtime, "BUCKETS", (2, 4))
    monkeypatch.setattr(triton_runtime, "SPLIT_EDGES", 32)
    return made, benched


def test_autotuned_launches_equal_the_torch_backend(gpu_launch):
    """GCN: every bucket's and the split rows' kernels autotuned; each config kept for a
    bucket has an edge tile no wider than Triton's ``early_config_prune`` allows for its
    degrees (``_prune`` reads ``MAX_DEG`` from the named positional arguments)."""
    made, benched = gpu_launch
    g = power_law_block(48)
    layer = LAYERS["gcn"](8)
    compare(layer, g, features(layer, g, 8))
    assert made, "no kernel went through triton.autotune"
    assert benched, "no kernel had more than one config left to time"
    seen = 0
    for tuner in made:
        if "MAX_DEG" not in tuner.keys:
            continue
        for key, config in tuner.cache.items():
            max_deg = key[tuner.keys.index("MAX_DEG")]
            assert config.kwargs["BLOCK_E"] <= max(16, triton_runtime._pow2(max_deg)), (key, config)
            seen += 1
    assert seen


def test_autotuned_typed_product_equals_the_torch_backend(gpu_launch):
    """RGCN: the typed product's segment GEMM and weight gradient (tl.dot tiles) and their
    grids, on the configs as listed (the interpreter's path shrinks them)."""
    made, _ = gpu_launch
    g = random_block(torch.Generator().manual_seed(2), 40, 40, 60)  # per edge: 40 x R > 60
    layer = LAYERS["rgcn"](8)
    compare(layer, g, features(layer, g, 8))
    assert any("BLOCK_M" in c.kwargs for t in made for c in t.configs)
