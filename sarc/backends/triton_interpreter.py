"""Triton's CPU interpreter, without re-patching ``triton.language`` at every device call.

Under ``TRITON_INTERPRET=1`` a launch replaces the builtins of the ``triton.language``
modules its kernel sees with interpreter versions, runs every program, then restores
them. Each call of a ``@triton.jit`` function inside a program (the generated modules'
helpers ``_convert``, ``_nan_max``, ...; ``tl.zeros`` and the rest of
``triton.language.standard``) patches the modules *it* sees again, although they stay
patched: an ``inspect.getmembers`` walk of the language, about a millisecond, per call
and per program, a third of the interpreter's time on sarc's kernels. Those patches
are never restored (the call discards them).

``skip_repeated_patches`` makes such a call skip the walk when every language module it
sees is patched already: by its launch, or for good by an earlier device call. A call
that sees another module patches it as before. Values are unchanged: patching is
idempotent (a patched member is no builtin, and is not patched again).

It relies on the interpreter of Triton 3 (``_patch_lang``, ``GridExecutor``,
``InterpretedFunction``); where those are not as described, nothing is changed.
"""
from __future__ import annotations

import functools
import inspect

_SEEN: set[int] = set()
"""ids of the ``triton.language`` modules that are patched now (``_patch_lang``)."""
_LAUNCH = ["out"]
"""Where the interpreter is: "out" of a launch, "entering" one (its own patch comes
next), or "in" one (its programs run)."""


class _Unchanged:
    """The patch scope of a call that patched nothing: nothing to restore."""

    def restore(self) -> None:
        pass


def _expected(interp) -> bool:
    """Whether the interpreter patches as the module doc says: a launch patches and
    restores; a device call patches and never restores."""
    try:
        launch = inspect.getsource(interp.GridExecutor.__call__)
        device = inspect.getsource(interp.InterpretedFunction.__call__)
    except (AttributeError, OSError, TypeError):
        return False
    return ("_patch_lang(" in launch and ".restore()" in launch
            and "_patch_lang(self.fn)" in device and "restore" not in device
            and list(inspect.signature(interp._patch_lang).parameters) == ["fn"])


@functools.cache
def skip_repeated_patches() -> bool:
    """Install the patch-once behaviour (once a process); whether it is installed."""
    import triton.language as tl
    import triton.runtime.interpreter as interp
    if not _expected(interp):
        return False
    patch, launch = interp._patch_lang, interp.GridExecutor.__call__
    languages = (tl, tl.core)

    def seen_by(fn) -> frozenset[int]:
        return frozenset(id(v) for v in fn.__globals__.values()
                         if inspect.ismodule(v) and v in languages)

    def patch_lang(fn):
        mods = seen_by(fn)
        if _LAUNCH[0] == "in" and mods <= _SEEN:
            return _Unchanged()
        scope = patch(fn)
        if _LAUNCH[0] == "entering":     # the launch's own patch: restored at its end
            _LAUNCH[0] = "in"
            _SEEN.update(mods)
            restore = scope.restore

            def restored() -> None:
                _SEEN.difference_update(mods)
                restore()
            scope.restore = restored
        elif _LAUNCH[0] == "in":         # a device call's: kept for good
            _SEEN.update(mods)
        return scope

    def launched(self, *args, **kwargs):
        _LAUNCH[0] = "entering"
        try:
            return launch(self, *args, **kwargs)
        finally:
            _LAUNCH[0] = "out"

    interp._patch_lang = patch_lang
    interp.GridExecutor.__call__ = launched
    return True
