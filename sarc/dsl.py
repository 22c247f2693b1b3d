"""The layer DSL: ``sarc.Layer`` with ``message``, ``reduce`` and ``update``.

A layer declares the node and edge features it reads and its parameters
(ordinary ``torch.nn`` modules and parameters), and writes three functions:

- ``message(src, dst, edge)``: per-edge values. ``src.h`` and ``dst.h`` read node
  feature ``h`` at each edge's endpoints, ``edge.w`` an edge feature. Returns one
  value or a dict of named messages (its keys identifiers, read in reduce as ``msg.<key>``).
- ``reduce(msg)``: aggregates messages into destination nodes with ``sarc.sum``,
  ``sarc.mean``, ``sarc.max``, ``sarc.min``; ``sarc.edge_softmax`` normalizes edge
  scores over each destination's incoming edges first.
- ``update(dst, agg)``: new destination features from the aggregates and the
  destination's own features (``dst.h``).

Calling the layer traces these functions once (``sarc.trace``), compiles the IR
with a backend and runs the generated code.
"""
from __future__ import annotations

import contextlib
import math
import sys
from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch import nn

from .errors import DSLError, GraphError, SourceLoc, class_loc
from .ir.function import Function
from .ir.ops import Op
from .ir.types import Domain, DType, TensorType
from .trace import Proxy, Tracer, call_returning, traces, user_loc
from .trace_torch import torch_integer_kind
from .trace_guards import TRACE_LOCK, tracing

BUILTIN_NODE = {"src": ("out_degree", "in_degree"), "dst": ("in_degree", "out_degree")}
"""The degrees every node has, on both ends of an edge: whole-graph degrees on a shard too
(a source's in-degree needs a block whose sources are its destinations: a whole graph)."""


@dataclass(frozen=True)
class Feature:
    """A declared node or edge feature: per-row shape and dtype.

    ``dtype=None`` (the default) is a float feature in the layer's precision: the
    dtype of its parameters (``Layer.precision``), so ``layer.half()`` or
    ``layer.to(torch.bfloat16)`` makes a half-precision layer whose features are
    given in that dtype too. A named dtype (``"f32"``, ``"i64"``) is fixed.
    """

    shape: tuple[int, ...] = ()
    dtype: str | None = None

    def __post_init__(self):
        # checked where it is declared: the user's line, not the layer's first call; the
        # frame above this one is the __init__ dataclasses generated
        loc = user_loc(sys._getframe(2))
        if not (isinstance(self.shape, (tuple, list))
                and all(type(d) is int and d >= 0 for d in self.shape)):
            raise DSLError(f"sarc.Feature shape must be a tuple of non-negative ints, got "
                           f"{self.shape!r}", loc)
        object.__setattr__(self, "shape", tuple(self.shape))
        dtype = self.dtype
        if dtype is None:
            return
        names = ", ".join(repr(d.value) for d in DType)
        if isinstance(dtype, torch.dtype):
            try:
                dtype = DType.from_torch(dtype).value
            except TypeError:
                hint = (" (a mask or flag: give it as a float 0 / 1, or as int64 ids)"
                        if dtype == torch.bool else "")
                raise DSLError(f"sarc.Feature dtype {dtype} is not one sarc computes with; "
                               f"dtypes are {names} (or torch.float32, torch.int64, ...)"
                               f"{hint}", loc) from None
        if dtype not in {d.value for d in DType}:
            raise DSLError(f"sarc.Feature dtype {self.dtype!r} is not one sarc computes with; "
                           f"dtypes are {names} (or torch.float32, torch.int64, ...)", loc)
        object.__setattr__(self, "dtype", dtype)

    def ir_type(self, domain: Domain, precision: DType = DType.F32) -> TensorType:
        return TensorType(domain, DType(self.dtype) if self.dtype else precision, tuple(self.shape))


INDEX = Feature((), "i64")
"""An int64 per-row feature, such as an edge type."""


def _declared(features: Any, side: str) -> dict[str, Feature]:
    """``node=`` / ``edge=`` of a layer: feature names to their declarations."""
    if features is None:
        return {}
    if not isinstance(features, Mapping) or not all(isinstance(k, str) for k in features):
        raise DSLError(f"{side}= takes a dict of feature names to widths, shapes or "
                       f"sarc.Feature (e.g. {side}={{'h': 16}}), got {features!r}", user_loc())
    for k in features:
        if k.startswith("$") or ":" in k:
            raise DSLError(f"{side} feature {k!r}: names that start with '$' or hold ':' are "
                           f"sarc's own (the distributed split's $x0, $agg0, autodiff's "
                           f"grad:h, param:w); name the feature otherwise", user_loc())
    return {k: _as_feature(v, k) for k, v in features.items()}


def _as_feature(spec: Any, what: str) -> Feature:
    if isinstance(spec, Feature):
        return spec
    if isinstance(spec, int):
        return Feature((spec,))
    if isinstance(spec, (tuple, list)) and all(isinstance(d, int) for d in spec):
        return Feature(tuple(spec))
    raise DSLError(f"feature {what!r} must be declared as an int (its width), a shape "
                   f"tuple or sarc.Feature, got {spec!r}", user_loc())


class _Side:
    """What ``src``, ``dst`` and ``edge`` are inside the user's functions."""

    def __init__(self, layer: "Layer", tracer: Tracer, domain: Domain, gather: Op | None,
                 role: str, precision: DType):
        object.__setattr__(self, "_layer", layer)
        object.__setattr__(self, "_precision", precision)
        object.__setattr__(self, "_tracer", tracer)
        object.__setattr__(self, "_domain", domain)
        object.__setattr__(self, "_gather", gather)
        object.__setattr__(self, "_role", role)

    def __getattr__(self, name: str) -> Proxy:
        if name.startswith("__"):   # Python's protocols (copy, pickle) ask for these
            raise AttributeError(name)
        return self[name]

    def __getitem__(self, name: str) -> Proxy:
        """``src["h"]``: a feature by name, any declared name (``src["__x"]`` too)."""
        feats = self._layer._sarc_edge if self._domain is Domain.EDGE else self._layer._sarc_node
        if name in feats:
            t = feats[name].ir_type(self._domain, self._precision)
        elif name in BUILTIN_NODE.get(self._domain.value, ()):
            t = TensorType(self._domain, self._precision, ())
        else:
            kind = "edge" if self._domain is Domain.EDGE else "node"
            declared = ", ".join(sorted(feats)) or "none"
            builtin = BUILTIN_NODE.get(self._domain.value, ())
            extra = f"; built in: {', '.join(builtin)}" if builtin else ""
            other = (self._layer._sarc_node if self._domain is Domain.EDGE
                     else self._layer._sarc_edge)
            hint = ""
            if name in other:
                hint = (f"; {name!r} is declared a node feature: message reads it as src.{name} "
                        f"or dst.{name}" if self._domain is Domain.EDGE else
                        f"; {name!r} is declared an edge feature: message reads it as "
                        f"edge.{name}, and what reaches the nodes is what reduce aggregates")
            raise DSLError(f"{self._role}.{name}: layer {type(self._layer).__name__} has no "
                           f"{kind} feature {name!r} (declared: {declared}{extra}){hint}",
                           user_loc())
        b = self._tracer.builder
        leaf = Proxy(self._tracer, b.leaf(Op.INPUT, name, t, user_loc()))
        if self._gather is None:
            return leaf
        return self._tracer.emit(self._gather, [leaf])

    def __setattr__(self, name, value):
        raise DSLError(f"{self._role} is read-only inside a layer; return new values instead",
                       user_loc())


class _Bundle:
    """Named values handed from one function to the next (messages, aggregates)."""

    def __init__(self, kind: str, values: dict[str, Proxy]):
        self._kind = kind
        self._values = values
        self._used: set[str] = set()

    def __getattr__(self, name: str) -> Proxy:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._values:
            raise DSLError(f"no {self._kind} named {name!r} (there are: "
                           f"{', '.join(self._values)})", user_loc())
        self._used.add(name)
        return self._values[name]

    __getitem__ = __getattr__

    def __iter__(self):
        raise DSLError(f"access {self._kind}s by name, e.g. msg.m", user_loc())


@dataclass(frozen=True)
class _Results:
    """What message, reduce or update returned, by name, and the user's line that returned it."""

    values: dict[str, Proxy]
    loc: SourceLoc | None


_RESULT_NAMES = {"message": "read in reduce as msg.<key>",
                 "reduce": "read in update as agg.<key>",
                 "update": "the names of the layer's outputs"}


def _results(what: str, default: str, fn, *args) -> _Results:
    """The named results of the user's ``fn(*args)`` (``what``: message, reduce, update):
    one traced value (named ``default``) or a non-empty dict of them keyed by identifiers
    (``msg.z``; ``_`` is left to the bundle's own names), for update's outputs by any
    non-empty str (generated code quotes them). Errors about them name the line
    that returned them (``fn``'s def line where that line cannot be seen)."""
    result, loc = call_returning(fn, *args)
    loc = loc or _loc_of(fn)
    if isinstance(result, Proxy):
        return _Results({default: result}, loc)
    if not isinstance(result, Mapping) or not result:
        got = "an empty dict" if isinstance(result, Mapping) else type(result).__name__
        raise DSLError(f"{what} must return a traced value or a dict of them, got {got}", loc)
    for key, value in result.items():
        if what == "update":  # names the caller reads from a dict: any non-empty str
            if not (isinstance(key, str) and key):
                raise DSLError(f"update returned a dict with the key {key!r}: the keys are "
                               f"{_RESULT_NAMES[what]}, so each must be a non-empty str", loc)
        elif not (isinstance(key, str) and key.isidentifier() and not key.startswith("_")):
            raise DSLError(f"{what} returned a dict with the key {key!r}: the keys are "
                           f"{_RESULT_NAMES[what]}, so each must be a str that is a Python "
                           f"identifier not starting with '_'", loc)
        if not isinstance(value, Proxy):
            raise DSLError(f"{what} returned {key!r} as a {type(value).__name__}, not a traced "
                           f"value", loc)
    return _Results(dict(result), loc)


_FORWARD_ARGUMENTS = ("g", "self")
"""``Layer.forward``'s own arguments: a feature of that name could not be given by name."""

_CALLED_BY_SARC = frozenset({"trace", "precision", "leaf_tensors", "compiled", "set_backend",
                             "set_autodiff", "run_local", "display_name"})
"""``Layer``'s methods sarc calls on a layer: an attribute of that name would hide one."""


class Layer(nn.Module):
    """Base class of DSL layers. Subclasses call ``super().__init__(node=..., edge=...)``.

    ``node`` and ``edge`` map feature names to their widths (int), shapes
    (tuple) or ``sarc.Feature``; ``sarc.INDEX`` declares an int64 type id.
    ``autodiff`` says where gradients come from: ``"torch"`` (autograd through the
    generated code) or ``"ir"`` (the layer's backward IR, see ``set_autodiff``).
    """

    def __init__(self, *, node: Mapping[str, Any] | None = None,
                 edge: Mapping[str, Any] | None = None, backend: str = "torch",
                 autodiff: str = "torch"):
        super().__init__()
        self._sarc_node = _declared(node, "node")
        self._sarc_edge = _declared(edge, "edge")
        try:   # checked as the setters check them, said at the user's line
            self.set_backend(backend).set_autodiff(autodiff)
        except ValueError as e:
            raise DSLError(str(e), user_loc()) from None
        for name in self._sarc_node:
            if name in self._sarc_edge:
                raise DSLError(f"feature {name!r} is declared both as a node and an edge feature",
                               user_loc())
        for name in self._sarc_edge:
            if any(name in names for names in BUILTIN_NODE.values()):
                raise DSLError(f"edge feature {name!r}: the name is sarc's built-in node degree "
                               f"(src.out_degree, dst.in_degree, ...); name the edge feature "
                               f"otherwise", user_loc())
        for name in (*self._sarc_node, *self._sarc_edge):
            if name in _FORWARD_ARGUMENTS:
                raise DSLError(f"feature {name!r}: the name of an argument of the layer's call "
                               f"layer(g, ...), so it could not be given by name; name the "
                               f"feature otherwise", user_loc())

    def _check_init(self) -> None:
        if "_sarc_node" not in self.__dict__:
            raise DSLError(_no_init(type(self), "first"), _loc_of(type(self).__init__))

    def __setattr__(self, name: str, value: Any) -> None:
        # nn.Module refuses a module or parameter assigned before its __init__ with an
        # AttributeError; say which call is missing, at the user's line.
        if "_parameters" not in self.__dict__ and isinstance(value, (nn.Module, nn.Parameter)):
            raise DSLError(_no_init(type(self), f"before assigning self.{name}"), user_loc())
        if name in _CALLED_BY_SARC:
            raise DSLError(f"self.{name} = ... hides sarc.Layer.{name}, which sarc calls; name "
                           f"the attribute otherwise", user_loc())
        super().__setattr__(name, value)

    def __call__(self, *args, **kwargs):
        if _under_torch_compile():   # sarc compiles the layer itself: opaque to dynamo
            import torch._dynamo as dynamo
            return dynamo.disable(Layer.__call__)(self, *args, **kwargs)
        if torch._C._are_functorch_transforms_active():
            raise DSLError(f"layer {type(self).__name__} called under a torch.func transform "
                            f"(vmap, grad, jacrev, jvp): a sarc layer's kernels are autograd "
                            f"Functions of its own, which the transforms do not go through; "
                            f"batch the graphs into one graph, and take gradients with "
                            f"torch.autograd", user_loc())
        self._check_init()
        with TRACE_LOCK:   # not while another thread traces it (its parameters swapped)
            self._note_features_dtype(args[1:], kwargs)
        return super().__call__(*args, **kwargs)

    def _note_features_dtype(self, args: tuple, feats: dict) -> None:
        """A layer without float parameters computes in the float dtype of the float
        features it is called with (those declared without a dtype): recorded here, read by
        ``precision``, and part of the state its kernel is compiled for. Two float dtypes
        among them are an error naming both (under autocast, its low dtype and float32 run
        in float32, as with parameters)."""
        if any(p.is_floating_point() for p in self.parameters()):
            return
        from .runtime.bind import resolve_features
        try:
            given = resolve_features(self, args, feats)
        except GraphError:
            return   # the call reports it
        seen: dict[torch.dtype, str] = {}
        for name, x in given.items():
            feat = self._sarc_node.get(name) or self._sarc_edge.get(name)
            if feat is not None and feat.dtype is None and isinstance(x, torch.Tensor) \
                    and x.is_floating_point():
                seen.setdefault(x.dtype, name)
        if not seen:
            return
        if len(seen) > 1:
            from .runtime.bind import autocast_state   # as binding the inputs reads it
            device = next(x for x in given.values() if isinstance(x, torch.Tensor)).device
            on, low = autocast_state(device.type)
            if not (on and set(seen) == {low, torch.float32}):
                (d1, n1), (d2, n2) = list(seen.items())[:2]
                raise GraphError(f"feature {n1!r} is {d1} and feature {n2!r} is {d2}: "
                                 f"{type(self).__name__} has no float parameters, so it "
                                 f"computes in its features' dtype; give them in one "
                                 f"(x.to({d1}))").at_call(self.display_name(), user_loc())
            seen = {torch.float32: ""}
        dtype = next(iter(seen))
        try:
            DType.from_torch(dtype)
        except TypeError:
            return   # not a dtype sarc computes in: the call reports it
        if self.__dict__.get("_features_dtype") != dtype:
            self._features_dtype = dtype   # a plain attribute: in the compiled state's key

    # The user's functions -------------------------------------------------------------
    def message(self, src, dst, edge):
        raise DSLError(f"layer {type(self).__name__} defines no message(src, dst, edge)",
                       class_loc(type(self)))

    def reduce(self, msg):
        raise DSLError(f"layer {type(self).__name__} defines no reduce(msg)",
                       class_loc(type(self)))

    def update(self, dst, agg):
        """Default: the aggregate itself (a layer with one aggregate)."""
        return agg._values if len(agg._values) > 1 else next(iter(agg._values.values()))

    def display_name(self) -> str:
        """The layer's name in messages: its class's (an imported module's class, for the
        layers the front ends make)."""
        return type(self).__name__

    # Tracing --------------------------------------------------------------------------
    def trace(self) -> Function:
        """Record message / reduce / update as IR (parameters become PARAM leaves). The IR
        is immutable: it is kept, and traced again only when what the trace read has
        changed (``layer_state.state_key``), so a check that traces a layer (a
        ``HeteroConv``'s widths) and its first call trace it once."""
        from .layer_state import state_key
        self._check_init()
        kept = self.__dict__.get("_sarc_traced")
        if kept is not None and kept[0] == state_key(self):
            return kept[1]
        with TRACE_LOCK:   # from before its parameters are swapped until they are back
            fn = self._trace()
            # the key after the trace: it has said which buffers it read as numbers
            self._sarc_traced = (state_key(self), fn)
        return fn

    def _trace(self) -> Function:
        _refuse_hooked_submodules(self)
        precision = self.precision()
        tracer = Tracer(type(self).__name__, precision)
        with _params_as_proxies(self, tracer, precision), tracing(self.modules()):
            msgs = _results("message", "m", self.message,
                            _Side(self, tracer, Domain.SRC, Op.GATHER_SRC, "src", precision),
                            _Side(self, tracer, Domain.DST, Op.GATHER_DST, "dst", precision),
                            _Side(self, tracer, Domain.EDGE, None, "edge", precision))
            for name, p in msgs.values.items():
                if p.type.domain is not Domain.EDGE:
                    raise DSLError(f"message {name!r} must be a per-edge value, got a "
                                   f"{p.type.domain.value} value {list(p.type.shape)}",
                                   tracer.builder.values[p.index].loc or msgs.loc)
            bundle = _Bundle("message", msgs.values)
            aggs = _results("reduce", "agg", self.reduce, bundle)
            unused = [name for name in msgs.values if name not in bundle._used]
            # A result's error names the line that returned it: the value may come from
            # elsewhere (reduce returning msg.m made in message, a parameter made nowhere).
            # It comes first: an unused message may be what the result should have aggregated.
            for name, p in aggs.values.items():
                if p.type.domain is not Domain.DST:
                    raise DSLError(f"reduce result {name!r} is {p.type.domain.article} value; "
                                   f"aggregate edge values with sarc.sum/mean/max/min"
                                   f"{_weights_hint(tracer, p, unused)}", aggs.loc)
            if unused:
                raise DSLError(f"message {unused[0]!r} is never used by reduce",
                               tracer.builder.values[msgs.values[unused[0]].index].loc
                               or msgs.loc)
            out = _results("update", "h", self.update,
                           _Side(self, tracer, Domain.DST, None, "dst", precision),
                           _Bundle("aggregate", aggs.values))
            for name, p in out.values.items():
                if p.type.domain is not Domain.DST:
                    raise DSLError(f"update result {name!r} must be a dst value, got a "
                                   f"{p.type.domain.value} value {list(p.type.shape)}", out.loc)
                kind = torch_integer_kind(p)
                if kind:   # sarc computes it as 0 / 1 or whole floats: named where it is made
                    what = ("a bool tensor in torch (a comparison)" if kind == "bool" else
                            "an int64 tensor in torch (a count or selection of integers)")
                    raise DSLError(f"update result {name!r} is {what}, and a sarc layer's "
                                   f"outputs are float: return it as floats (.float(), "
                                   f".to(x.dtype); torch.where(cond, 1.0, 0.0))",
                                   tracer.builder.values[p.index].loc or out.loc)
        from .ir.verifier import verify
        fn = tracer.builder.finish((k, p.index) for k, p in out.values.items())
        verify(fn)
        return fn

    def precision(self) -> DType:
        """The dtype of the layer's float parameters: the dtype of its float features
        declared without one. A layer without float parameters computes in the float dtype
        of the features of its last call (f32 before one). Parameters of two float dtypes
        are an error."""
        seen: dict[torch.dtype, str] = {}
        for name, p in self.named_parameters():
            if p.is_floating_point():
                seen.setdefault(p.dtype, name)
        if len(seen) > 1:
            (d1, n1), (d2, n2) = list(seen.items())[:2]
            raise DSLError(f"layer {type(self).__name__} mixes parameter dtypes: {n1} is {d1}, "
                           f"{n2} is {d2}; convert the whole layer (layer.to(dtype)) or use "
                           f"torch.autocast", _loc_of(type(self).__init__))
        if seen:
            return DType.from_torch(next(iter(seen)))
        return DType.from_torch(self.__dict__.get("_features_dtype", torch.float32))

    def leaf_tensors(self) -> dict[str, torch.Tensor]:
        """What the layer's PARAM leaves read, by name: its parameters, and its floating-point
        buffers in the layer's precision (a buffer is state read at each call, so an annealed
        temperature or a loaded one is never a stale constant)."""
        out = dict(self.named_parameters())
        dtype = None
        for name, b in self.named_buffers():
            if b.is_floating_point():
                dtype = dtype or self.precision().to_torch()
                out[name] = b if b.dtype == dtype else b.to(dtype)
        return out

    # Compilation and execution ------------------------------------------------------
    def compiled(self):
        """The backend's kernel for this layer: compiled on first use, and again when what
        the trace read has changed (``layer_state.state_key``: the precision after
        ``layer.half()``, a number on the layer, a parameter's shape)."""
        from .layer_state import state_key
        key = state_key(self)
        if self._sarc_compiled is None or self._sarc_compiled[0] != key:
            from .compiler import compile_function
            kernel = compile_function(self.trace(), backend=self._sarc_backend,
                                      autodiff=self._sarc_autodiff)
            # the key again: the trace has said which buffers it read as numbers
            self._sarc_compiled = (state_key(self), kernel)
        return self._sarc_compiled[1]

    def set_backend(self, backend: str) -> "Layer":
        """Compile with ``backend`` ("torch", "triton") from the next call on."""
        from .compiler import BACKENDS
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; available: {', '.join(BACKENDS)}")
        self._sarc_backend = backend
        self._sarc_compiled = None
        return self

    def set_autodiff(self, mode: str) -> "Layer":
        """``"ir"``: gradients from the layer's backward IR (``sarc.ir.autodiff``),
        compiled like the layer; ``"torch"``: torch autograd through the generated code."""
        from .compiler import AUTODIFF
        if mode not in AUTODIFF:
            raise ValueError(f"unknown autodiff {mode!r}; available: {', '.join(AUTODIFF)}")
        self._sarc_autodiff = mode
        self._sarc_compiled = None
        return self

    def __getstate__(self):
        # The compiled kernel holds an imported module, which can be neither pickled
        # nor deep-copied; a copy (copy.deepcopy, torch.save) recompiles on first use.
        state = dict(super().__getstate__())
        state["_sarc_compiled"] = state["_sarc_traced"] = None
        return state

    def forward(self, g, *args, **feats):
        """Run the layer on graph ``g``: features positionally (declaration order) or by name.

        The graph runs the layer (``g.run_layer``): a ``Graph`` calls ``run_local``, a
        ``sarc.distributed.DistGraph`` (a worker's shard in a process group) runs the
        layer's distributed schedule. The layer does not know which graphs exist.
        """
        run = getattr(g, "run_layer", None)
        if run is None:
            raise GraphError(f"a sarc layer runs on a sarc.Graph, got {type(g).__name__} (build "
                             f"one with sarc.Graph.from_edges or sarc.interop; a worker's shard "
                             f"is a sarc.distributed.DistGraph)")
        try:
            return run(self, args, feats)
        except GraphError as e:
            if e.layer is not None:  # a layer called inside this one's call said where
                raise
            # which of the model's layers, called at which line, was given the wrong data
            raise e.at_call(self.display_name(), user_loc()) from None

    def run_local(self, g, args: tuple, feats: dict):
        """The layer's compiled kernel on the block ``g`` (a ``Graph``)."""
        from .runtime.bind import bind_inputs
        with TRACE_LOCK:   # the layer's state as no trace in another thread has swapped it
            kernel = self.compiled()
            inputs = bind_inputs(self, kernel.function, g, args, feats)
            leaves = self.leaf_tensors()
        out = kernel(g, inputs, leaves, self.training)
        return out if len(out) > 1 else next(iter(out.values()))


def _under_torch_compile() -> bool:
    """Whether dynamo (``torch.compile``) is tracing this call."""
    is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    if is_compiling is None:   # torch 2.2: dynamo's own, where it was imported at all
        is_compiling = getattr(sys.modules.get("torch._dynamo"), "is_compiling", None)
    return bool(is_compiling is not None and is_compiling())


def _refuse_hooked_submodules(layer: nn.Module) -> None:
    """A hook on a submodule's calls would act once, while the layer is traced, and never
    on the compiled kernel's calls (which do not call the submodule): refused, naming it.
    (A hook on the layer itself wraps each call, and acts as on any module.)"""
    from .layer_state import CALL_HOOKS, call_hooks
    for path, mod in layer.named_modules():
        hooks = call_hooks(mod) if path else ()
        if hooks:
            raise DSLError(f"submodule {path!r} ({type(mod).__name__}) of layer "
                           f"{type(layer).__name__} has a hook registered with "
                           f"{CALL_HOOKS[hooks[0][0]]}: sarc compiles the layer's code into "
                           f"kernels that never call the submodule, so the hook would not run "
                           f"at each call; remove it, or register it on the layer itself",
                           _loc_of(type(layer).__init__))


def _no_init(cls: type, when: str) -> str:
    return f"{cls.__name__}.__init__ must call super().__init__(node=..., edge=...) {when}"


def _loc_of(fn):
    code = getattr(fn, "__code__", None)
    return SourceLoc(code.co_filename, code.co_firstlineno, code.co_name) if code else None


class _BufferProxy(Proxy):
    """A floating-point buffer while tracing: a PARAM leaf read at each call; where the
    layer's code uses it as a Python number (``math.sqrt(self.tau)``, ``float``, an ``if``),
    its value now, a constant, and its name goes to ``seen`` (the layer's
    ``_sarc_numbers``), whose buffers the layer's state key then watches
    (``layer_state.state_key``)."""

    __slots__ = ("value", "name", "seen")

    def __init__(self, tracer: Tracer, index: int, value: torch.Tensor, name: str, seen: set):
        super().__init__(tracer, index)
        self.value, self.name, self.seen = value, name, seen

    def _number(self) -> torch.Tensor:
        if self.value.numel() != 1:
            raise DSLError(f"buffer {self.name} of shape {list(self.value.shape)} used as a "
                           f"Python number: only a one-element buffer has one", user_loc())
        self.seen.add(self.name)
        return self.value.detach().reshape(())

    def __float__(self):
        return float(self._number())

    def __bool__(self):
        return bool(self._number())

    def __int__(self):
        return int(self._number())

    __index__ = __int__


@contextlib.contextmanager
def _params_as_proxies(layer: nn.Module, tracer: Tracer, precision: DType):
    """Swap every parameter and floating-point buffer (in ``precision``, as
    ``Layer.leaf_tensors`` passes it) for a PARAM proxy while tracing, then put them back.
    A tensor held under two names (a tied weight, ``self.b.weight = self.a.weight``) is one
    leaf, named as ``named_parameters`` names it: its first name."""
    saved = []
    numbers: set[str] = set()
    layer._sarc_numbers = numbers
    proxies: dict[int, Proxy] = {}
    try:
        for mod_name, mod in layer.named_modules():
            for table, floats_only in ((mod._parameters, False), (mod._buffers, True)):
                for pname, x in list(table.items()):
                    if x is None or floats_only and not x.is_floating_point():
                        continue
                    saved.append((table, pname, x))
                    if id(x) not in proxies:
                        full = f"{mod_name}.{pname}" if mod_name else pname
                        dtype = precision if floats_only else DType.from_torch(x.dtype)
                        t = TensorType(Domain.PARAM, dtype, tuple(x.shape))
                        leaf = tracer.builder.leaf(Op.PARAM, full, t)
                        proxies[id(x)] = (_BufferProxy(tracer, leaf, x, full, numbers)
                                          if floats_only else Proxy(tracer, leaf))
                    table[pname] = proxies[id(x)]
        yield
    finally:
        for table, pname, x in saved:
            table[pname] = x


# --- reductions and graph functions ------------------------------------------------------

def _reduce(kind: str):
    def fn(x):
        if not isinstance(x, Proxy):
            raise DSLError(f"sarc.{kind} takes a traced edge value, got {type(x).__name__}",
                           user_loc())
        return x.tracer.emit(Op.REDUCE, [x], {"kind": kind})
    fn.__name__ = kind
    fn.__doc__ = f"Per destination node, the {kind} of an edge value over its incoming edges."
    return traces(name=f"sarc.{kind}")(fn)


sum = _reduce("sum")  # noqa: A001 - the DSL's names, used as sarc.sum
mean = _reduce("mean")
max = _reduce("max")  # noqa: A001
min = _reduce("min")  # noqa: A001


def _weights_hint(tracer: Tracer, p: Proxy, unused: list[str]) -> str:
    """For a reduce result that is an edge softmax: how weights are used."""
    if tracer.builder.values[p.index].op is not Op.EDGE_SOFTMAX:
        return ""
    m = unused[0] if unused else "m"
    return (f"; sarc.edge_softmax gives each edge a weight: weigh the messages with it and "
            f"aggregate them (a = sarc.edge_softmax(...); return sarc.sum(msg.{m} * "
            f"a.unsqueeze(-1)))")


@traces(name="sarc.edge_softmax")
def edge_softmax(score) -> Proxy:
    """softmax of an edge score over each destination node's incoming edges."""
    if not isinstance(score, Proxy):
        raise DSLError("sarc.edge_softmax takes a traced edge value", user_loc())
    return score.tracer.emit(Op.EDGE_SOFTMAX, [score])


class TypedLinear(nn.Module):
    """A linear map per type: ``y[i] = x[i] @ W[type[i]]`` (RGCN's per-relation weight).

    With ``num_bases`` the table is a basis decomposition,
    ``W[r] = sum_b comp[r, b] * bases[b]`` (Schlichtkrull et al., 2018).
    """

    def __init__(self, in_feats: int, out_feats: int, num_types: int,
                 num_bases: int | None = None):
        super().__init__()
        self.in_feats, self.out_feats, self.num_types = in_feats, out_feats, num_types
        self.num_bases = num_bases
        if num_bases is None:
            self.weight = nn.Parameter(torch.empty(num_types, in_feats, out_feats))
            nn.init.xavier_uniform_(self.weight)
        else:
            self.bases = nn.Parameter(torch.empty(num_bases, in_feats, out_feats))
            self.comp = nn.Parameter(torch.empty(num_types, num_bases))
            nn.init.xavier_uniform_(self.bases)
            nn.init.xavier_uniform_(self.comp)

    def table(self):
        if self.num_bases is None:
            return self.weight
        flat = self.bases.reshape(self.num_bases, self.in_feats * self.out_feats)
        return (self.comp @ flat).reshape(self.num_types, self.in_feats, self.out_feats)

    def forward(self, x, types):
        if isinstance(x, Proxy) or isinstance(types, Proxy):
            if not (isinstance(x, Proxy) and isinstance(types, Proxy)):
                bad = types if isinstance(x, Proxy) else x
                raise DSLError(f"TypedLinear needs a traced value and a traced int64 type per "
                               f"row (e.g. edge.etype), got {type(bad).__name__}", user_loc())
            return x.tracer.emit(Op.TYPED_LINEAR, [x, self.table(), types])
        w = self.table()
        return torch.bmm(x.unsqueeze(1), w[types]).squeeze(1)


def edge_inputs_for(model: nn.Module, carried: Mapping[str, Any]) -> dict[str, Any]:
    """The edge features of ``carried`` (what a graph or partition holds) that ``model``
    reads: those its sarc layers declare and its ``forward`` takes by name. A trainer calls
    ``model(g, x, **edge_inputs_for(model, carried))``, so an edge feature a partition
    happens to carry (``etype``) never reaches a model that does not read it. A module
    that is not a layer names what it reads in ``sarc_inputs`` (``sarc.HeteroConv``:
    ``etype`` and the node types ``ntype``). A model of library convs that run through sarc
    by themselves (DGL's after ``patch()``), whose layers are declared at their first call,
    reads what its ``forward`` names (``forward(g, x, edge_weight=None)``). A wrapper whose
    ``forward`` passes its keywords on (the trainer's learned input, ``EmbeddingInput``)
    names the module it passes them to in ``sarc_passes_inputs_to``: that module's
    ``forward`` says what is taken, not the wrapper's ``**edge_inputs``."""
    import inspect
    declared = declared_edge_inputs(model)
    params = inspect.signature(input_taker(model).forward).parameters.values()
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params)
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if routes_library_convs(model):
        declared += [k for k in named if k in carried]
    return {k: carried[k] for k in dict.fromkeys(declared)
            if k in carried and (takes_any or k in named)}


def declared_edge_inputs(model: nn.Module) -> list[str]:
    """The edge data the model's sarc layers declare and its other modules name in
    ``sarc_inputs``, in module order (a name may repeat)."""
    declared = [k for m in model.modules() if isinstance(m, Layer) for k in m._sarc_edge]
    return declared + [k for m in model.modules() for k in getattr(type(m), "sarc_inputs", ())]


def input_taker(model: nn.Module) -> nn.Module:
    """The module whose ``forward`` says which edge inputs ``model`` takes: the model, or
    the module a wrapper names in ``sarc_passes_inputs_to`` (followed to the last)."""
    taker = model
    while getattr(type(taker), "sarc_passes_inputs_to", None):
        taker = getattr(taker, type(taker).sarc_passes_inputs_to)
    return taker


BACKEND_OF_MADE_LAYERS = "_sarc_layers_backend"
"""Where ``sarc.training.device.placed`` leaves, on a library conv that makes its sarc
layers at its calls (DGL's after ``patch()``), the backend they compile for."""


def backends_named(names) -> str:
    """A set of backend ``names`` as a run logs and records the kernels it trains with:
    sorted, joined by "+" ("torch+triton"); none: "torch"."""
    return "+".join(sorted(set(names))) or "torch"


def routes_library_convs(model: nn.Module) -> bool:
    """Whether the model runs library convs through sarc (DGL's after ``patch()``), whose
    layers declare their edge data at their first call."""
    return any(getattr(type(m).forward, "_sarc_routed", False) for m in model.modules())


def glorot_(t: torch.Tensor) -> torch.Tensor:
    """Glorot/Xavier uniform init over the last two dims (as PyG's ``glorot``)."""
    a = math.sqrt(6.0 / (t.size(-2) + t.size(-1)))
    with torch.no_grad():
        return t.uniform_(-a, a)


__all__ = ["Layer", "Feature", "INDEX", "TypedLinear", "sum", "mean", "max", "min",
           "edge_softmax", "glorot_", "edge_inputs_for", "GraphError"]
