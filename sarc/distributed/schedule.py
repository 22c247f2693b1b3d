"""The schedule runtime: a layer called on a ``DistGraph`` runs its generated schedule.

``run_layer`` (what ``sarc.Layer.forward`` calls with a ``DistGraph``) binds the
call's features, compiles the layer for the graph once (``sarc.compiler.compile_layer``
for the graph's target: trace -> passes -> plan -> the cut at the exchange ->
the ``dist_backend`` schedule), and runs the generated ``forward`` inside a
``torch.autograd.Function`` whose backward runs the generated ``backward``: the
user's training loop stays plain PyTorch.

``Call`` is the runtime a generated schedule calls (``rt`` there): the parts'
inputs, the row exchange of each pass over the source blocks (which peers'
rows move, which are kept, per the plan: ``exchange.RowFetch``), the merges,
and the bookkeeping of the backward pass: every part is recomputed with
autograd (``node_vjp``, ``edge_vjp``) and its gradients go where they belong
(params, node and edge features, the dst values, the exchanged rows, which
go back to their owners and are added there).
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from ..backends import dist_backend
from ..backends.torch_backend import output_reaches
from ..amp import autocast_state
from .. import compiler
from ..backward_once import once_differentiable
from ..dsl import TRACE_LOCK
from ..graph import Graph
from ..ir import rng
from ..ir.ops import Op
from ..ir.split import AGGREGATE_OPS, LayerSplit
from ..ir.types import Domain
from ..layer_state import state_key
from ..planner.plan import LayerPlan
from ..runtime.bind import BUILTINS, check_feature, check_type_ids, resolve_features
from ..training.layer_calls import input_needs_grad
from .exchange import RowFetch, send_kept_grads
from .graph import DistError, DistGraph
from .pieces import Piece
from .merge import NormalizerMerge, SiteShares, make_merge


@dataclass
class LayerProgram:
    """A layer compiled for a distributed graph: its plan, its split, its schedule module;
    ``differentiated``: the params, and the features, its gradient reaches
    (``autodiff.differentiated_leaves`` of the traced layer); ``state``: the layer's
    ``layer_state.state_key`` it was compiled at; ``draws``: the layer has a dropout
    (``rng.draws_masks``: a training call draws a seed)."""

    name: str
    plan: LayerPlan
    split: LayerSplit
    generated: dist_backend.Generated
    differentiated: tuple[frozenset, frozenset] = (frozenset(), frozenset())
    state: tuple = ()
    draws: bool = False
    reaches: tuple = ()   # per output, the leaves a gradient may reach (output_reaches)

    @property
    def module(self):
        return self.generated.module

    @property
    def source(self) -> str:
        return self.generated.source


def compile_layer(layer, dg: DistGraph, name: str, inputs_need_grad: bool,
                  again: bool = False) -> LayerProgram:
    # the layer's IR as it runs on one process (the pipeline and the passes of the layer's
    # backend, whose kernels run the blocks), planned for dg, cut at the exchange, and its
    # schedule; ``again``: a call of a layer whose earlier call awaits its backward, in sar
    unshared = again or _runs_another_layers_share(layer, dg)
    target = compiler.Target(mode=dg.mode, workers=dg.size, stats=dg.stats,
                             exec_mode="sar" if unshared else dg.exec_mode,
                             mem_budget=None if unshared else _budget_left(dg, layer),
                             baseline=dg.baseline, inputs_need_grad=inputs_need_grad,
                             distributed=True,
                             kept_peers=None if unshared else dg.kept_share.get(id(layer)))
    c = compiler.compile_layer(layer, layer._sarc_backend, target=target, name=name)
    from ..ir.autodiff import differentiated_leaves
    return LayerProgram(name, c.plan, c.split, c.schedule, differentiated_leaves(c.traced),
                        draws=rng.draws_masks(c.optimized),
                        reaches=() if c.split is None else output_reaches(c.split.layer))


def share_memory(model, dg: DistGraph) -> None:
    """Share ``dg.mem_budget`` over a whole training step of ``model``: which peers' rows
    each of its sarc layers keeps (``sarc.planner.plan.share_step``; the layers in
    module order, the first block's input needing no gradient), and whether its
    ``sarc.HeteroConv``s fetch their inputs once within it. The trainer calls it
    before the first step; the layers' programs are planned with the shares. Layers made
    at their first call (a patched DGL conv's) are not there yet: each keeps what the
    budget has left when it is planned (``_budget_left``)."""
    from ..dsl import Layer
    from ..hetero import relation_fetches
    from ..planner.plan import share_step
    layers = [m for m in model.modules() if isinstance(m, Layer)]
    dg.fetch_within_budget = False
    if not shares_budget(dg) or not layers:
        return
    found = (relation_fetches(model, layers)
             if dg.mode == "full" and dg.exec_mode is None and not dg.baseline else None)
    kept, dg.fetch_within_budget = share_step(step_layers(layers, model), found, dg.stats,
                                              dg.mem_budget, dg.baseline)
    for layer, peers in zip(layers, kept):
        if peers is not None:   # a relation's layer on the fetched rows keeps no share
            dg.kept_share[id(layer)] = peers
    dg.programs.clear()


def shares_budget(dg: DistGraph) -> bool:
    """Whether the layers on ``dg`` share a memory budget (a plan of kept peers: several
    workers, the planner's or the hybrid execution mode)."""
    return dg.mem_budget is not None and dg.size > 1 and dg.exec_mode in (None, "hybrid")


def step_layers(layers, model=None) -> list:
    """A step's sarc layers, in call order, as ``share_budget`` prices them: each optimized
    for its backend, and whether its input needs a gradient (all but the first block's:
    with ``model``, a first ``sarc.HeteroConv``'s relations' layers all read its input,
    ``sarc.hetero.call_blocks``)."""
    from ..hetero import call_blocks
    blocks = call_blocks(model, layers) if model is not None else range(len(layers))
    return [(compiler.compile_layer(layer, layer._sarc_backend, through="optimize").optimized,
             b > 0) for b, layer in zip(blocks, layers)]


def _runs_another_layers_share(layer, dg: DistGraph) -> bool:
    """Whether ``layer`` runs on a step's block whose budget share was priced for another of
    the model's layers: the share pairs them in declaration order with the blocks in call
    order, and this model calls them in another. Such a block is planned in sar, keeping
    no remote row, so the step stays within the budget (``BlockGraphs`` shares it again in
    call order for the next step). The block records which layer ran on it."""
    share_of = getattr(dg, "share_of", None)   # a block of a mini-batch step's
    if share_of is None:
        return False
    k, layers = share_of
    dg.ran_by = layer
    return layer is not layers[k] and any(layer is m for m in layers)


def _budget_left(dg: DistGraph, layer):
    """Per worker, the budget a layer not in a shared plan gets: what the layers planned
    before it keep leaves, first come first served. (It cannot reserve what later layers
    keep of their own shards; ``share_memory``, which the trainer calls, does.)"""
    if dg.mem_budget is None or id(layer) in dg.kept_share:
        return dg.mem_budget
    taken = {}
    for (lid, *_), prog in dg.programs.items():
        if lid != id(layer) and prog.plan.bytes_kept is not None:
            kept = prog.plan.bytes_kept
            taken[lid] = [max(a, b) for a, b in zip(taken.get(lid, kept), kept)]
    return tuple(dg.mem_budget - sum(t[r] for t in taken.values()) for r in range(dg.size))


def calls_again(layer, dg: DistGraph) -> bool:
    """Whether a training call of ``layer`` on ``dg`` is one of several in a step that share
    a memory budget: an earlier call of it (weight sharing) still awaits its backward,
    keeping the rows its plan keeps. The budget was shared over the model's layers, one
    share each: such a call runs in sar, keeping no remote row, so the step stays within
    the budget (``sarc compile`` plans a step's later calls of a layer so)."""
    if not torch.is_grad_enabled() or not shares_budget(dg):
        return False
    earlier = dg.awaiting.get(id(layer))
    return earlier is not None and earlier() is not None


def program_for(layer, dg: DistGraph, inputs_need_grad: bool,
                again: bool = False) -> LayerProgram:
    """The layer's program on ``dg``, compiled on first use (named by class and first-call
    order), and again when what its trace read has changed (``Layer.compiled``);
    ``again``: its program for a call while an earlier one awaits its backward
    (``calls_again``). A relation's sub-graph of the whole graph plans its own (a layer
    shared by relations is planned on each one's statistics: ``DistGraph.plans_own``)."""
    key = (id(layer), inputs_need_grad, again, dg.stats if dg.plans_own else None)
    state = state_key(layer)
    if key not in dg.programs or dg.programs[key].state != state:
        dg.programs[key] = compile_layer(layer, dg, dg.layer_name(layer), inputs_need_grad,
                                         again)
        dg.programs[key].state = state_key(layer)  # after the trace (Layer.compiled)
    return dg.programs[key]


def run_layer(layer, dg: DistGraph, args: tuple, feats: dict):
    """``layer(dg, ...)``: the layer's distributed schedule on this worker's shard."""
    given = resolve_features(layer, args, feats)
    with TRACE_LOCK:   # the layer's state as no trace in another thread has swapped it
        prog = program_for(layer, dg, input_needs_grad(layer, given), calls_again(layer, dg))
        leaves = layer.leaf_tensors()
    if prog.split is None:
        return _node_wise(layer, dg, prog, given)
    fn = prog.split.layer
    node_inputs, edge_inputs = {}, {}
    for name, t in fn.inputs().items():  # what the layer reads: local rows, local edges
        if name in BUILTINS and name not in layer._sarc_node:
            continue  # the whole graph's degrees, from the shard
        if t.domain is Domain.EDGE:
            edge_inputs[name] = check_feature(layer, name, given, t, dg.num_edges,
                                              "local edges", dg.device)
        else:
            node_inputs[name] = check_feature(layer, name, given, t, dg.num_local,
                                              "local nodes", dg.device)
    check_type_ids(layer, fn, {**node_inputs, **edge_inputs})  # this worker's rows
    params = {k: p for k, p in leaves.items() if k in fn.params()}
    if torch.is_grad_enabled():
        dg.record_training_call(layer, prog)
    training = layer.training
    seed = rng.call_seed(prog.draws, training, None)
    call = Call(prog, dg, node_inputs, edge_inputs, params, training, seed)
    call.differentiable = torch.is_grad_enabled()   # its forward keeps the node parts' graphs
    flat = [*params.values(), *node_inputs.values(), *edge_inputs.values()]
    call.keys = [*(("param", k) for k in params), *(("input", k) for k in node_inputs),
                 *(("input", k) for k in edge_inputs)]
    outs = _DistLayer.apply(call, *flat)
    if call.differentiable:   # kept, with what it keeps, until its backward (calls_again)
        dg.awaiting[id(layer)] = weakref.ref(call)
    names = [k for k, _ in fn.outputs]
    return outs[0] if len(names) == 1 else dict(zip(names, outs))


def _node_wise(layer, dg: DistGraph, prog: LayerProgram, given: dict):
    """A layer that aggregates nothing over edges (``compiler._distribute`` made no split):
    its kernel on this worker's rows alone (``DistGraph.rows``, the rows' whole-graph
    degrees), as on one process; its edge features, checked, are read by nothing."""
    if torch.is_grad_enabled():   # it sends nothing, as planned
        dg.record_training_call(layer, prog)
    feats = {}
    for name, t in layer.trace().inputs().items():
        if name not in given:
            continue
        if t.domain is Domain.EDGE:
            check_feature(layer, name, given, t, dg.num_edges, "local edges", dg.device)
            feats[name] = given[name][:0]
        else:
            feats[name] = given[name]
    return layer.run_local(dg.rows, (), feats)


class _DistLayer(torch.autograd.Function):
    """One layer call: the generated forward schedule; backward: the generated backward."""

    @staticmethod
    def forward(ctx, call, *flat):
        call.needs = ctx.needs_input_grad[1:]
        # the backward recomputes parts of the forward: under the same autocast, or it
        # computes other values (a max no edge attains any more, a dtype the kept tensors
        # do not have)
        ctx.autocast = (call.dg.device.type, *autocast_state(call.dg.device.type))
        out = call.program.module.forward(call)
        outs = []
        for name, _ in call.program.split.layer.outputs:
            t = out[name]
            outs.append(t.clone() if any(t is f for f in flat) else t)
        ctx.call = call
        # as torch's autograd (and the layer on one process): an output no leaf needing a
        # gradient reaches has no grad_fn, and one the loss does not read gives its leaves
        # no gradient (None)
        tracked = {k for k, t in zip(call.keys, flat) if t.requires_grad}
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(*(t for t, reach in zip(outs, call.program.reaches)
                                      if not reach & tracked))
        return tuple(outs)

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads):
        call = ctx.call
        if call is None:   # its rows were sent, its kept graphs freed, by the first backward
            raise DistError(ONE_BACKWARD)
        ctx.call = None
        fn = call.program.split.layer
        grad_out = {}
        for (name, i), g in zip(fn.outputs, grads):
            if g is None:
                g = torch.zeros((call.dg.num_dst, *fn.values[i].type.feat),
                                dtype=fn.values[i].type.dtype.to_torch(), device=call.dg.device)
            grad_out[name] = g
        device_type, enabled, dtype = ctx.autocast
        with torch.enable_grad(), torch.autocast(device_type, dtype=dtype, enabled=enabled):
            flat_grads = call.program.module.backward(call, grad_out)
        reached = frozenset().union(*(r for r, g in zip(call.program.reaches, grads)
                                      if g is not None))
        return (None, *(g if key in reached else None
                        for key, g in zip(call.keys, flat_grads)))


_PART_KEYS = {"src": 1, "dst": 2, "edge": 3, "post": 4}

ONE_BACKWARD = ("a layer on a DistGraph runs one backward pass per call: the first sends its "
                "row gradients to their owners and frees what the forward kept, so a second "
                "one through the same call (retain_graph=True) is not supported; call the "
                "layer again for another")


class Call:
    """The runtime of one layer call (``rt`` in the generated schedule)."""

    def __init__(self, program: LayerProgram, dg: DistGraph, node_inputs: dict,
                 edge_inputs: dict, params: dict, training: bool, seed: int | None):
        self.program, self.dg = program, dg
        self.split = program.split
        self.plan = program.plan
        self.shard = dg.shard
        self.node_inputs, self.edge_inputs = node_inputs, edge_inputs
        self.params, self.training, self._seed = params, training, seed
        n = dg.num_local
        self.own = dg.own
        inputs = program.split.layer.inputs()  # the degrees in the layer's precision
        builtins = {k: dg.degree(k, inputs[k].dtype.to_torch())
                    for k in ("in_degree", "out_degree") if k in inputs}
        self.src_inputs = self.dst_inputs = {**builtins, **node_inputs}
        if dg.num_dst < n:  # a bipartite local block: the destinations are the first rows
            self.dst_inputs = {k: t[:dg.num_dst] for k, t in self.src_inputs.items()}
        r, p = dg.rank, dg.size
        kept = self.plan.kept_peers
        self.kept_by_me = set(kept[r]) if p > 1 else set()
        self.readers_keeping = {j for j in range(p) if j != r and r in kept[j]}
        self.kept: dict[int, torch.Tensor] = {}
        self.first_fetch = True
        self.needs = ()
        self.differentiable = False
        self.recorded: dict = {}  # node part -> (its leaves, its outputs under autograd)
        self.keys: list = []      # ("param" | "input", name) of each differentiated tensor
        self.saved = None

    # --- forward --------------------------------------------------------------------------
    def seed(self, part: str, piece: Piece | None = None) -> int | None:
        """The dropout seed of a part (of a piece): distinct per worker, part and piece,
        the same when the backward pass recomputes it."""
        if self._seed is None:
            return None
        j, c = piece.key if piece is not None else (4098, 0)
        key = ((self.dg.rank * 4099 + j) * 65536 + c) * 8 + _PART_KEYS[part]
        return rng.mask_seed(self._seed, key)

    def node_part(self, part, feeds: dict, seed) -> dict:
        """A node-local part (src, dst_pre, dst_post) in the forward pass. In a call that
        will be differentiated it runs under autograd on leaves of its feeds, and its graph
        is kept for ``node_vjp``: the backward pass does not compute it again (it keeps what
        the layer on a ``Graph`` keeps of its node values, as the plan's figure says; only
        edge values and remote rows are recomputed). Its outputs are returned detached."""
        if not (self.differentiable and any(self.needs)):
            return part(self.own, feeds, self.params, self.training, seed)
        leaves = self._leaves(feeds)
        with torch.enable_grad():
            outs = part(self.own, leaves, self._param_leaves(), self.training, seed)
        self.recorded[part] = (leaves, outs)
        return {k: v.detach() for k, v in outs.items()}

    def pack(self, values: dict) -> torch.Tensor:
        """The exchanged values of every owned row side by side: [num_local, width]."""
        n = self.dg.num_local
        cols = [values[s.name].reshape(n, math.prod(s.type.feat))  # n may be 0 (a sampled block)
                for s in self.split.exchanged]
        return torch.cat(cols, 1).contiguous() if len(cols) > 1 else cols[0].contiguous()

    def unpack(self, rows: torch.Tensor) -> dict:
        out, off = {}, 0
        for s in self.split.exchanged:
            w = 1
            for d in s.type.feat:
                w *= d
            out[s.name] = rows[:, off:off + w].reshape(rows.shape[0], *s.type.feat)
            off += w
        return out

    def dst_feeds(self, x: torch.Tensor) -> dict:
        """A dst part's feeds: the dst inputs and the exchanged values ``x`` on the worker's
        destinations (its first rows), which a dst value equal to an exchanged value's rows
        reads instead of computing them again (``sarc.ir.split``)."""
        n = self.dg.num_dst
        return {**self.dst_inputs, **{k: t[:n] for k, t in self.unpack(x).items()}}

    def fetch(self, x, phase: str, which: str) -> RowFetch:
        """The rows of a pass over the source blocks (``which``: normalizers or main)."""
        p, r = self.dg.size, self.dg.rank
        peers = {j for j in range(p) if j != r}
        first = self.first_fetch
        self.first_fetch = False
        backward = phase == "backward"
        grads = backward and x is not None and self.x_needs_grad
        f = RowFetch(
            self.dg.exchanger, self.shard, x, phase=phase,
            send_to=peers if first else peers - self.readers_keeping,
            recv_from=peers if first else peers - self.kept_by_me,
            keep=self.kept_by_me if first else set(), kept=self.kept,
            grads_from=(peers - self.readers_keeping) if grads else set(),
            all_at_once=first and self.plan.exec_mode == "oneshot",
            pieces=self.dg.pieces, chunk_rows=self.dg.chunk_rows, returns_grads=grads)
        if backward:
            self.fetches.append(f)
        return f

    def block(self, piece: Piece) -> Graph:
        return piece.block

    def block_inputs(self, piece: Piece, rows, d: dict) -> dict:
        """A piece's feeds: its source rows, the dst values at its destinations, its edges'
        features (in its CSR order)."""
        feeds = at_rows(d, piece.rows)
        if rows is not None:
            feeds.update(self.unpack(rows))
        if self.edge_inputs:
            j = piece.peer
            lo, hi = self.dg.edge_offsets[j], self.dg.edge_offsets[j + 1]
            for name, t in self.edge_inputs.items():
                feeds[name] = t[lo:hi].index_select(0, piece.block.perm)
        return feeds

    def piece_norms(self, piece: Piece, norms: dict) -> dict:
        """The global softmax normalizers (M, S) at a piece's destinations."""
        return at_rows(norms, piece.rows)

    def merges(self, norms: dict) -> "Merges":
        return Merges(self, norms)

    def normalizer_merges(self) -> "NormalizerMerges":
        return NormalizerMerges(self)

    def save(self, **kw) -> None:
        x = kw["x"]
        self.x_needs_grad = x is not None and self._x_needs_grad()
        self.edges_need_grad = self._edges_need_grad()
        self.saved = SimpleNamespace(**kw)
        # the backward pass starts its own fetches from the forward's kept rows
        self.fetches: list[RowFetch] = []
        self.kept_grads: dict[int, torch.Tensor] = {}  # per kept peer: [its rows, width]
        self.grad_node: dict[str, torch.Tensor] = {}
        self.grad_edge: dict[str, torch.Tensor] = {}
        self.grad_d: dict[str, torch.Tensor] = {}
        self.grad_x: dict[str, torch.Tensor] = {}  # the dst parts' ($x<k> on the first rows)
        self.site_shares: dict[str, SiteShares] = {}  # unfused edge_softmax: per piece
        self.grad_params: dict[str, torch.Tensor] = {}
        self._owned: set[tuple[int, str]] = set()  # the sums above that are their own tensors
        self.row_grad: torch.Tensor | None = None

    @property
    def needs(self) -> tuple[bool, ...]:
        """Whether each parameter, node input and edge input, in that order, needs a
        gradient (the layer's autograd node sets it)."""
        return self._needs

    @needs.setter
    def needs(self, needs) -> None:
        self._needs = tuple(needs)
        # by kind and name: a parameter and a feature may share a name (a node and an edge
        # feature may not)
        keys = [*(("param", k) for k in self.params),
                *(("input", k) for k in (*self.node_inputs, *self.edge_inputs))]
        self._needs_by = dict(zip(keys, self._needs))

    def _value_needs(self, v) -> bool:
        """Does IR value ``v``, a parameter or an input, need a gradient?"""
        if v.op is Op.PARAM:
            return self._need(v.attr["name"], "param")
        return v.op is Op.INPUT and self._need(v.attr["name"])

    def _x_needs_grad(self) -> bool:
        """Do the exchanged rows carry gradients (do they depend on a param or an input that
        needs one)? Decided from the plan's IR, the same on every worker."""
        fn = self.split.src
        return fn is not None and any(self._value_needs(v) for v in fn.values)

    def _edges_need_grad(self) -> bool:
        """Does a gradient flow through the edges (does an aggregate depend on a param or an
        input that needs one)? If not, the backward pass does not revisit the blocks (the
        planner decides the same: ``LayerPlan.backward_passes == 0``)."""
        dep: list[bool] = []
        for v in self.split.layer.values:
            dep.append(self._value_needs(v) or any(dep[j] for j in v.inputs))
        return any(dep[i] for i, v in enumerate(self.split.layer.values) if v.op in AGGREGATE_OPS)

    # --- backward -------------------------------------------------------------------------
    def _need(self, name: str, kind: str = "input") -> bool:
        """Does the input (``kind`` "param": the parameter) ``name`` need a gradient?"""
        return self._needs_by.get((kind, name), False)

    def _param_leaves(self) -> dict:
        if not hasattr(self, "_pleaves"):
            self._pleaves = {k: p.detach().requires_grad_(self._need(k, "param"))
                             for k, p in self.params.items()}
        return self._pleaves

    def _grad(self, outs, wrt: dict, cots=None) -> dict:
        """d(outs)/d(wrt) contracted with ``cots``; None where a leaf is unused."""
        items = [(k, t) for k, t in wrt.items() if t.requires_grad]
        outs_list = outs if isinstance(outs, (list, tuple)) else [outs]
        if not items or not any(o.requires_grad for o in outs_list):
            return {}
        grads = torch.autograd.grad(outs, [t for _, t in items], cots, allow_unused=True)
        return {k: g for (k, _), g in zip(items, grads) if g is not None}

    def _accumulate(self, store: dict, name: str, g: torch.Tensor,
                    rows: torch.Tensor | None = None, n: int | None = None) -> None:
        """store[name] += g (g at destination ``rows`` of ``n``, or at every row). ``g`` is
        autograd's, maybe the very tensor it gave for another name too (an add's operands get
        their sum's gradient): it is stored as it is but never added to in place; a sum at
        rows is added into a tensor of the store's own (``_owned``: (store, name))."""
        key = (id(store), name)
        if rows is None:
            if name in store:
                store[name] = store[name] + g
                self._owned.add(key)
            else:
                store[name] = g
            return
        if name not in store:
            store[name] = g.new_zeros((n, *g.shape[1:]))
        elif key not in self._owned:
            store[name] = store[name].clone()
        self._owned.add(key)
        store[name].index_add_(0, rows, g)

    def _take_param_grads(self, grads: dict) -> None:
        for k, g in grads.items():
            if k.startswith("param:"):
                self._accumulate(self.grad_params, k[6:], g)

    def _leaves(self, feeds: dict) -> dict:
        """A node part's feeds as autograd leaves: a gradient for sarc's own values ($...)
        and for the inputs that need one."""
        leaves = {}
        for k, t in feeds.items():
            want = (k.startswith("$") or self._need(k)) and t.dtype.is_floating_point
            leaves[k] = t.detach().requires_grad_(want)
        return leaves

    def node_vjp(self, part, feeds: dict, seed, cot: dict) -> dict:
        """The gradients of a node-local part: of its graph kept by the forward pass
        (``node_part``), else of the part computed again with autograd; returns the
        gradients of its ``$agg`` feeds, adds the others (features, dst values, params) to
        the call's."""
        pleaves = self._param_leaves()
        kept = self.recorded.pop(part, None)
        if kept is not None:
            leaves, outs = kept
        else:
            leaves = self._leaves(feeds)
            outs = part(self.own, leaves, pleaves, self.training, seed)
        pairs = [(outs[k], c) for k, c in cot.items() if c is not None and outs[k].requires_grad]
        if not pairs:
            return {}
        wrt = {**leaves, **{f"param:{k}": p for k, p in pleaves.items()}}
        grads = self._grad([o for o, _ in pairs], wrt, [c for _, c in pairs])
        self._take_param_grads(grads)
        out = {}
        for k, g in grads.items():
            if k.startswith("$agg"):
                out[k] = g
            elif k.startswith("$d"):
                self._accumulate(self.grad_d, k, g)
            elif k.startswith("$x"):  # a dst part's read of the worker's exchanged rows
                self._accumulate(self.grad_x, k, g)
            elif k in self.node_inputs:
                if g.shape[0] < self.dg.num_local:  # a dst part's, on the first rows
                    g = torch.cat([g, g.new_zeros((self.dg.num_local - g.shape[0], *g.shape[1:]))])
                self._accumulate(self.grad_node, k, g)
        return out

    def edge_vjp(self, part, fetch: RowFetch, piece: Piece, rows, d: dict, norms: dict,
                 cot: dict) -> None:
        """Recompute a piece with autograd (its scalar surrogate); route its gradients."""
        row_leaf = None
        if rows is not None:
            row_leaf = rows.detach().requires_grad_(self.x_needs_grad)
        at = piece.rows
        d, norms = at_rows(d, at), at_rows(norms, at)
        cot = {k: v.at(piece.key, at, norms[k][1]) if isinstance(v, SiteShares)
               else at_rows({k: v}, at)[k] for k, v in cot.items()}
        d_leaves = {k: t.detach().requires_grad_(True) for k, t in d.items()}
        feeds = {**self.block_inputs(piece, row_leaf, {}), **d_leaves}  # d_leaves: at its rows
        for name in self.edge_inputs:
            if self._need(name):
                feeds[name] = feeds[name].detach().requires_grad_(True)
        norm_leaves = {}
        for k, (m, s) in norms.items():
            site = k.startswith("$sm")
            norm_leaves[k] = (m, s.detach().requires_grad_(site))
        pleaves = self._param_leaves()
        loss = part(piece.block, feeds, pleaves, self.training, self.seed("edge", piece),
                    norm_leaves, cot)
        wrt = {**{k: feeds[k] for k in d_leaves},
               **{k: feeds[k] for k in self.edge_inputs if self._need(k)},
               **{f"param:{k}": p for k, p in pleaves.items()},
               **{f"norm:{k}": s for k, (m, s) in norm_leaves.items()}}
        if row_leaf is not None:
            wrt["rows"] = row_leaf
        grads = self._grad(loss, wrt)
        self._take_param_grads(grads)
        n = self.dg.num_dst
        for k, g in grads.items():
            if k.startswith("$d"):
                self._accumulate(self.grad_d, k, g, at, n)
            elif k.startswith("norm:"):  # what a site's main pass leaves its normalizer pass
                self.site_shares.setdefault(k[5:], SiteShares(n)).add(piece.key, g, at)
            elif k in self.edge_inputs:
                self._scatter_edge_grad(piece, k, g)
        if row_leaf is not None and self.x_needs_grad:
            g = grads.get("rows")
            if g is None:
                g = torch.zeros_like(rows)
            j = piece.peer
            if j != self.dg.rank and j in self.kept_by_me:
                if j not in self.kept_grads:
                    n = int(self.shard.needed_rows[j].numel())
                    self.kept_grads[j] = g.new_zeros((n, g.shape[1]))
                self.kept_grads[j][piece.lo:piece.hi] += g
            else:
                fetch.give_grad(piece, g)

    def _scatter_edge_grad(self, piece: Piece, name: str, g: torch.Tensor) -> None:
        if name not in self.grad_edge:
            self.grad_edge[name] = torch.zeros_like(self.edge_inputs[name])
        lo = self.dg.edge_offsets[piece.peer]
        self.grad_edge[name].index_add_(0, piece.block.perm + lo, g)

    def normalizer_cotangents(self) -> dict:
        """Per unfused edge_softmax site, what its main pass left (``merge.SiteShares``)."""
        n = self.dg.num_dst
        return {s.name: self.site_shares.get(s.name, SiteShares(n))
                for s in self.split.softmax_sites}

    def return_kept_row_grads(self) -> None:
        """Gradients of rows received this call, back to their owners: kept rows' now, in one
        go; and this worker's rows' gradients from every reader, summed."""
        total = None
        for f in self.fetches:
            if f.grad_local is not None:
                total = f.grad_local if total is None else total + f.grad_local
        if self.saved.x is not None and self.x_needs_grad and self.dg.size > 1:
            back = send_kept_grads(self.dg.exchanger, self.shard, self.saved.x, self.kept_grads,
                                   self.readers_keeping, "backward")
            if back is not None:
                total = back if total is None else total + back
        self.row_grad = total
        self.kept.clear()
        self.kept_grads.clear()

    def grads_of(self, d: dict) -> dict:
        return {k: self.grad_d[k] if k in self.grad_d else torch.zeros_like(t)
                for k, t in d.items()}

    def row_grads(self) -> dict:
        """The gradients of this worker's exchanged values: from every reader of its rows
        and from its dst parts (on the first rows)."""
        rows = self.row_grad if self.row_grad is not None else torch.zeros_like(self.saved.x)
        out = self.unpack(rows)
        for k, g in self.grad_x.items():
            whole = out[k].clone()
            whole[:g.shape[0]] += g
            out[k] = whole
        return out

    def input_grads(self) -> tuple:
        params, features = self.program.differentiated
        leaves = [(k in params, t) for k, t in self.params.items()]
        leaves += [(k in features, t) for k, t in (*self.node_inputs.items(),
                                                     *self.edge_inputs.items())]
        out = [self.grad_params.get(k) for k in self.params]
        out += [self.grad_node.get(k) for k in self.node_inputs]
        out += [self.grad_edge.get(k) for k in self.edge_inputs]
        # where no piece ran (a block without edges): torch's zero, not None, for the params
        # and features the gradient reaches, as the layer's kernel on one process gives
        # (an edge feature's: empty)
        return tuple(None if not need else torch.zeros_like(t) if g is None and reached
                     else g for g, need, (reached, t) in zip(out, self.needs, leaves))


class Merges:
    """The merges of one pass over the blocks (one per aggregate of the layer).

    It holds the layer's split and the worker's sizes, not the ``Call``: the call saves
    it for the backward pass, and a reference back would make a cycle that keeps every
    call's saved tensors alive until Python's cycle collector happens to run."""

    def __init__(self, call: Call, norms: dict):
        self.split, self.num_dst, self.device = call.split, call.dg.num_dst, call.dg.device
        deg = call.dg.edges_into
        self.rules = {a.name: make_merge(a, deg, norms.get(a.name) if call.dg.baseline else None)
                      for a in call.split.aggregates}

    def add(self, piece: Piece, parts: dict) -> None:
        """A piece's partial aggregates, at its destination rows."""
        for k, part in parts.items():
            self.rules[k].add(part, piece.rows, self.num_dst)

    def finish(self) -> dict:
        out = {}
        for a in self.split.aggregates:
            t = self.split.edge.values[dict(self.split.edge.outputs)[a.name]].type
            # the aggregate's shape and dtype, and its value where no block gave a part:
            # zero, stored once (a rule that returns it makes it a tensor of its own)
            zeros = torch.zeros((), dtype=t.dtype.to_torch(), device=self.device).expand(
                self.num_dst, *t.feat)
            out[a.name] = self.rules[a.name].finish(zeros)
        return out

    def cotangents(self, grads: dict, aggs: dict) -> dict:
        """The merge rules' cotangents of the aggregates ``aggs`` given their gradients."""
        out = {}
        for a in self.split.aggregates:
            g = grads.get(a.name)
            if g is None:
                g = torch.zeros_like(aggs[a.name])
            out[a.name] = self.rules[a.name].cotangent(g)
        return out


class NormalizerMerges:
    """Softmax normalizers over every block: unfused edge_softmax sites and, in baseline
    mode, the fused softmax aggregates (no online softmax). Like ``Merges``, it does not
    refer back to the call."""

    def __init__(self, call: Call):
        self.device, self.num_dst = call.dg.device, call.dg.num_dst
        split, n = call.split, call.dg.num_dst
        edge = split.edge
        self.types = {s.name: ((n, *s.feat), edge.values[s.index].type.dtype.to_torch())
                      for s in split.softmax_sites}
        if call.dg.baseline:
            outputs = dict(edge.outputs)
            self.types.update({a.name: ((n, *a.score_feat),
                                        edge.values[outputs[a.name]].type.dtype.to_torch())
                               for a in split.aggregates if a.kind == "softmax"})
        self.rules = {k: NormalizerMerge(call.dg.edges_into) for k in self.types}

    def add(self, piece: Piece, parts: dict) -> None:
        for k, part in parts.items():
            self.rules[k].add(part, piece.rows, self.num_dst)

    def finish(self) -> dict:
        return {k: r.finish(*self.types[k], self.device) for k, r in self.rules.items()}


def at_rows(values: dict, rows: torch.Tensor | None) -> dict:
    """Per-destination values (tensors, or tuples of them: merge states, normalizers) at
    ``rows`` (a piece's destinations; None: all)."""
    if rows is None:
        return dict(values)

    def pick(v):
        if isinstance(v, tuple):
            return tuple(pick(t) for t in v)
        return v.index_select(0, rows)
    return {k: pick(v) for k, v in values.items()}
