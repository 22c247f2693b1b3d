"""Model-file sources the CLI tests write: ``MEAN`` defines ``Mean(i, o)`` (its sources'
mean ``h``, then a linear map) with the imports it needs; a test adds its ``Net`` and
``build_model``."""

MEAN = '''\
import sarc
from torch import nn


class Mean(sarc.Layer):
    def __init__(self, i, o):
        super().__init__(node={"h": i})
        self.lin = nn.Linear(i, o)

    def message(self, src, dst, edge):
        return src.h

    def reduce(self, msg):
        return sarc.mean(msg.m)

    def update(self, dst, agg):
        return self.lin(agg.agg)
'''
