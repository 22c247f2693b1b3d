"""A layer called from several threads: a call in one thread while another traces the
layer (its first calls arriving together, as in a threaded server) waits for the trace,
which swaps the layer's parameters for the tracer's placeholders in place, rather than
reading those."""
from __future__ import annotations

import threading
import time

import torch
from torch import nn

import sarc


class SlowToTrace(sarc.Layer):
    """Its message takes a while, which only the trace runs (the kernel does not)."""

    def __init__(self):
        super().__init__(node={"h": 4})
        self.lin = nn.Linear(4, 3)

    def message(self, src, dst, edge):
        time.sleep(0.3)
        return self.lin(src.h)

    def reduce(self, msg):
        return sarc.sum(msg.m)


def test_a_call_while_another_thread_traces_the_layer_waits_for_the_trace():
    torch.manual_seed(0)
    g = sarc.Graph.from_edges(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]), 3)
    x = torch.randn(3, 4)
    layer = SlowToTrace()
    outs, errors = {}, []

    def call(name: str) -> None:
        try:
            outs[name] = layer(g, x)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(f"{name}: {type(e).__name__}: {e}")

    first = threading.Thread(target=call, args=("first",))
    first.start()
    time.sleep(0.1)   # the first call is inside its trace now, the parameters swapped
    second = threading.Thread(target=call, args=("second",))
    second.start()
    first.join()
    second.join()
    assert errors == []
    assert outs["first"].shape == (3, 3) and torch.equal(outs["first"], outs["second"])
    assert all(isinstance(p, nn.Parameter) for p in layer.parameters())


class SharedDropout(sarc.Layer):
    """A layer holding a module that eager code in another thread uses too."""

    def __init__(self, drop: nn.Dropout):
        super().__init__(node={"h": 4})
        self.lin, self.drop = nn.Linear(4, 3), drop

    def message(self, src, dst, edge):
        time.sleep(0.3)
        return self.drop(self.lin(src.h))

    def reduce(self, msg):
        return sarc.sum(msg.m)


def test_eager_code_in_another_thread_sees_a_modules_own_mode_while_a_layer_is_traced():
    """The trace reads ``training`` of the layer's modules as the traced mode, in the
    tracing thread only: a thread running a shared module meanwhile reads its mode."""
    torch.manual_seed(0)
    g = sarc.Graph.from_edges(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]), 3)
    drop = nn.Dropout(0.5)
    layer = SharedDropout(drop)
    layer.eval()
    seen, errors = [], []

    def trace() -> None:
        try:
            layer(g, torch.randn(3, 4))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(f"trace: {type(e).__name__}: {e}")

    def eager() -> None:
        try:
            seen.append(drop.training)
            seen.append(torch.equal(drop(torch.ones(8)), torch.ones(8)))  # eval: the input
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(f"eager: {type(e).__name__}: {e}")

    tracer = threading.Thread(target=trace)
    tracer.start()
    time.sleep(0.1)   # inside the trace now
    other = threading.Thread(target=eager)
    other.start()
    other.join()
    tracer.join()
    assert errors == []
    assert seen == [False, True]
    assert drop.training is False and layer.training is False
