"""Small DSL layers that tests in several folders share (beyond the model zoo, ``zoo``)."""
from __future__ import annotations

from torch import nn

import sarc


class TwoOutputs(sarc.Layer):
    """``o1`` reads the parameter, ``o2`` only the features (a max of differences): an
    output the loss does not read leaves the parameter without a gradient."""

    def __init__(self):
        super().__init__(node={"h": 3})
        self.lin = nn.Linear(3, 3)

    def message(self, src, dst, edge):
        return {"m": self.lin(src.h), "k": src.h - dst.h}

    def reduce(self, msg):
        return {"x": sarc.sum(msg.m), "y": sarc.max(msg.k)}

    def update(self, dst, agg):
        return {"o1": agg.x, "o2": agg.y.tanh()}
