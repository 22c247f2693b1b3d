"""Bad inputs of the backends: a backend sarc does not have, a Triton fallback refused."""
from __future__ import annotations

import pytest

from sarc.backends import triton_backend

from .catalogue import case
from .harness import ROOT, assert_error, run_sarc


CONCAT_MODEL = """
import sarc
from torch import nn


class Concat(sarc.Layer):
    def __init__(self, fin):
        super().__init__(node={"h": fin})

    def message(self, src, dst, edge):
        return sarc.concat([src.h, dst.h.relu()], -1)

    def reduce(self, msg):
        return sarc.sum(msg.m)


class Net(nn.Module):
    def __init__(self, fin, ncls):
        super().__init__()
        self.conv1 = Concat(fin)
        self.out = nn.Linear(2 * fin, ncls)

    def forward(self, g, x):
        return self.out(self.conv1(g, x))


def build_model(in_feats, num_classes, **hparams):
    return Net(in_feats, num_classes)
"""


@case("cli", "`SARC_TRITON_STRICT=1 sarc compile --backend triton --emit schedule` of a layer "
      "whose edge part has an op without a Triton kernel", "error")
def test_strict_triton_refuses_an_op_on_torch(tmp_path):
    try:
        triton_backend.check_triton()
    except triton_backend.TritonUnavailable as e:
        pytest.skip(str(e))
    model = tmp_path / "concat_model.py"
    model.write_text(CONCAT_MODEL)
    proc = run_sarc("compile", model, "--backend", "triton", "--workers", "2",
                    "--emit", "schedule", "--out", tmp_path / "out",
                    env={"SARC_TRITON_STRICT": "1"})
    assert_error(proc, "layer Concat", "aggregate", "concat cannot run inside a Triton kernel")
    assert not (tmp_path / "out").exists()


@case("cli", "`sarc compile --backend cuda`: a backend sarc does not have", "error")
def test_unknown_backend_names_the_available_ones(tmp_path):
    proc = run_sarc("compile", ROOT / "models" / "gcn.py", "--backend", "cuda",
                    "--out", tmp_path / "out")
    assert_error(proc, "'cuda'", "torch", "triton")
