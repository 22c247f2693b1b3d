"""sarc's autograd Functions differentiate once, and say so when asked for a second
derivative.

Their backward passes run sarc's kernels (CSR products, fused Triton kernels, the
distributed schedule's exchanges), which record no autograd graph of their own. torch's
``once_differentiable`` marks such a backward, but its error waits for a path that
reaches the marked node, and a second derivative taken with respect to some tensors
(a gradient penalty's, with respect to the weights) can miss it and come out silently
wrong. A backward run with ``create_graph=True`` runs with grad mode on; ``once_differentiable``
here refuses it then, at the first sarc Function the backward pass meets.
"""
from __future__ import annotations

import functools

import torch

from .errors import SarcError


class SecondDerivativeError(SarcError, RuntimeError):
    """A backward pass through a sarc layer was asked to build a graph for a second
    derivative."""


SECOND_DERIVATIVE = ("a sarc layer differentiates once: a second derivative through it "
                     "(torch.autograd.grad(..., create_graph=True), a gradient penalty, "
                     "backward(create_graph=True)) is not supported; its backward pass runs "
                     "sarc's kernels, which are not themselves differentiated")


def once_differentiable(backward):
    """``torch.autograd.function.once_differentiable``, refusing a backward pass that
    builds a graph (``create_graph=True``) when it reaches ``backward``."""
    inner = torch.autograd.function.once_differentiable(backward)

    @functools.wraps(backward)
    def checked(ctx, *grads):
        if torch.is_grad_enabled():
            raise SecondDerivativeError(SECOND_DERIVATIVE)
        return inner(ctx, *grads)
    return checked
