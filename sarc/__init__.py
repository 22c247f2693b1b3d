"""sarc: a compiler for distributed training of graph neural networks.

Write a layer as message / reduce / update (``sarc.Layer``); sarc traces it to
an IR, optimizes it and generates the code that runs it.
"""
from .errors import DSLError, GraphError, SarcError
from .errors import passes_on as _passes_on
from .version import __version__

__all__ = ["Layer", "Feature", "INDEX", "TypedLinear", "Graph", "sum", "mean", "max", "min",
           "edge_softmax", "HeteroConv", "TypedInput", "dropout", "leaky_relu", "elu", "concat",
           "linear", "glorot_",
           "DSLError", "GraphError", "SarcError", "load_trained"]

_FROM = {"load_trained": "checkpoint", "Graph": "graph", "HeteroConv": "hetero",
         "TypedInput": "hetero",
         **dict.fromkeys(("Layer", "Feature", "INDEX", "TypedLinear", "edge_softmax", "glorot_",
                          "sum", "mean", "max", "min"), "dsl"),
         **dict.fromkeys(("dropout", "leaky_relu", "elu", "concat", "linear"), "trace")}
"""The module of each public name: imported at the name's first use, so that what imports
only a light module of sarc (torchrun's agent: ``sarc.distributed.agent``) does not load the
compiler (torch, sympy) with the package."""

_SUBPACKAGES = frozenset({"interop", "distributed", "frontends", "datasets"})
"""Modules the README writes as attributes of ``sarc`` (``sarc.interop.from_pyg``), imported
at their first use: the frontends import their library only when a user reaches them."""


@_passes_on
def __getattr__(name: str):
    import importlib
    if name in _FROM:
        value = getattr(importlib.import_module(f".{_FROM[name]}", __name__), name)
        globals()[name] = value
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'sarc' has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_FROM, *_SUBPACKAGES})
