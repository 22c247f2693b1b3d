"""Bad inputs of the backends: a backend sarc does not have, a Triton fallback refused."""
from __future__ import annotations

import pytest

from sarc.backends import triton_backend

from .catalogue import case
from .harness import ROOT, assert_error, run_sarc


@case("cli", "`SARC_TRITON_STRICT=1 sarc compile --backend triton --emit schedule` of a GAT "
      "whose schedule needs a block op without a Triton kernel", "error")
def test_strict_triton_refuses_a_schedule_block_op_on_torch(tmp_path):
    try:
        triton_backend.check_triton()
    except triton_backend.TritonUnavailable as e:
        pytest.skip(str(e))
    proc = run_sarc("compile", ROOT / "models" / "gat.py", "--backend", "triton", "--workers", "2",
                    "--emit", "schedule", "--out", tmp_path / "out",
                    env={"SARC_TRITON_STRICT": "1"})
    assert_error(proc, "layer conv1", "edge_softmax", "block op edge_softmax_global",
                 "no Triton kernel yet for an unfused edge_softmax's normalizer pass")
    assert not (tmp_path / "out").exists()


@case("cli", "`sarc compile --backend cuda`: a backend sarc does not have", "error")
def test_unknown_backend_names_the_available_ones(tmp_path):
    proc = run_sarc("compile", ROOT / "models" / "gcn.py", "--backend", "cuda",
                    "--out", tmp_path / "out")
    assert_error(proc, "'cuda'", "torch", "triton")
