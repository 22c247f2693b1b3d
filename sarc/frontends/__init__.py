"""Front ends: layers written for other GNN libraries, compiled by sarc.

Each front end traces a library's unmodified layer into sarc's IR, so the layer plans,
runs on every backend and distributes as a DSL layer does: ``sarc.frontends.dgl``
(DGL's nn modules, ``patch()``) and ``sarc.frontends.pyg`` (PyG ``MessagePassing``
layers; a sarc layer as a PyG convolution). The libraries are imported inside the
front ends' functions, never when sarc is imported.
"""

from ..errors import DSLError


def in_module(name: str, e: DSLError) -> DSLError:
    """``e``, raised while tracing the library module ``name``, named for it. Where its line
    is in the library's installed code, not the user's, the hint of the problem (written
    for code the user wrote) is followed by what it means there: this use of the module
    is not traced."""
    problem = e.problem if e.problem.startswith(f"{name}:") else f"{name}: {e.problem}"
    from ..trace import _installed
    if e.loc is not None and _installed(e.loc.file) and "the module's own code" not in problem:
        problem += (f" (this is in the module's own code: sarc does not trace {name} used "
                    f"this way; call it with other arguments, or write the layer in sarc's DSL)")
    return DSLError(problem, e.loc)


def follow_mode(wrapper, module) -> None:
    """The wrapper of a library module takes the module's train / eval mode at each call:
    its dropout is on or off as the module's own forward would have it, whether the user
    switched the wrapper (which switches the module with it) or the module itself
    (``conv.eval()``, or ``model.eval()`` on a model that holds the module)."""
    if wrapper.training != module.training:
        wrapper.train(module.training)
