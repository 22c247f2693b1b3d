"""sarc: a compiler for distributed training of graph neural networks.

Write a layer as message / reduce / update (``sarc.Layer``); sarc traces it to
an IR, optimizes it and generates the code that runs it.
"""
from .checkpoint import load_trained
from .dsl import (INDEX, Feature, Layer, TypedLinear, edge_softmax, glorot_, max, mean,
                  min, sum)
from .errors import DSLError, GraphError, SarcError
from .graph import Graph
from .hetero import HeteroConv, TypedInput
from .trace import concat, dropout, elu, leaky_relu, linear
from .trace_guards import passes_on as _passes_on
from .version import __version__

__all__ = ["Layer", "Feature", "INDEX", "TypedLinear", "Graph", "sum", "mean", "max", "min",
           "edge_softmax", "HeteroConv", "TypedInput", "dropout", "leaky_relu", "elu", "concat",
           "linear", "glorot_",
           "DSLError", "GraphError", "SarcError", "load_trained"]

_SUBPACKAGES = frozenset({"interop", "distributed", "frontends", "datasets"})
"""Modules the README writes as attributes of ``sarc`` (``sarc.interop.from_pyg``), imported
at their first use: ``import sarc`` stays light, and the frontends import their library only
when a user reaches them."""


@_passes_on
def __getattr__(name: str):
    if name in _SUBPACKAGES:
        import importlib
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'sarc' has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_SUBPACKAGES})
