"""Learnable node embeddings sharded with the partition, and their sparse optimizers.

``Embedding`` is a [num_rows, dim] table of which each worker holds its
partition's rows (a ``ShardedTensor``): memory per worker is 1/P of the table,
and 1/P of the optimizer state. ``emb(ids)`` pulls the rows of any global ids
(a collective call: every worker calls it, with its own ids); their gradient
stays sparse: the looked-up rows are leaves whose ``.grad`` the backward pass
fills (nothing is sent then), and the optimizer's ``step`` sends each row's gradient to its owner (one
exchange, repeats summed on both sides), which updates only the rows touched.
The table is no ``nn.Parameter``, so the dense parameters' all-reduce and
optimizer never see it.

The optimizers follow torch's sparse ones exactly, so a P-worker run equals
one process with ``nn.Embedding(sparse=True)``:

- ``SparseAdagrad``: ``torch.optim.Adagrad`` on a sparse gradient: per-row sums
  of squares, only the touched rows' sums and values change;
- ``SparseAdam``: ``torch.optim.SparseAdam``: lazy first and second moments
  (only the touched rows'), the bias correction by the table's step count
  (the steps in which any worker's batch touched the table).

A row's initial values are a pure function of (seed, the row's key)
(``sarc.training.inputs.initial_embedding``, which one process draws its
``nn.Embedding`` from): ``keys``, one per local row, are the nodes' original ids in
training, else the global row ids; so every worker draws its rows as one process
would, without holding the table. ``Embedding.initial_table`` is the whole table, for a single-process reference.

The local rows are the module's buffer ``weight``: ``state_dict`` holds this worker's
rows (a checkpoint's, the model selection's copy), ``load_state_dict`` puts them back in
place; the optimizers' ``state_dict`` holds their state of the same rows.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from ..sampling.comm import Comm
from ..training.inputs import EMBEDDING_OPTIMIZERS, initial_embedding
from .store import ShardedTensor, StoreError, coalesce

class Embedding(nn.Module):
    """A learnable [num_rows, dim] table sharded by ``offsets`` (``ShardedGraph.node_offsets``).

    One process: ``Embedding(num_rows, dim)``. A worker: ``Embedding.for_graph(dg, dim)``
    (a ``DistGraph``) or pass ``offsets``, ``rank`` and ``comm`` (a ``sarc.sampling.Comm``).
    ``scale``: the half-width of the uniform initial values (default ``1 / sqrt(dim)``).
    """

    def __init__(self, num_rows: int | None, dim: int, *, offsets=None, rank: int = 0,
                 comm: Comm | None = None, seed: int = 0, scale: float | None = None,
                 keys: torch.Tensor | None = None, dtype: torch.dtype = torch.float32,
                 name: str = "embedding"):
        super().__init__()
        if offsets is None:
            if num_rows is None or num_rows < 0:
                raise StoreError(f"embedding {name!r} needs a row count or the partition's offsets")
            offsets = torch.tensor([0, num_rows])
        offsets = torch.as_tensor(offsets, dtype=torch.int64).cpu()
        if num_rows is not None and int(offsets[-1]) != num_rows:
            raise StoreError(f"embedding {name!r} has {num_rows} rows but the partition "
                             f"{int(offsets[-1])} nodes")
        if dim < 1:
            raise StoreError(f"embedding {name!r} needs a positive width, got {dim}")
        self.dim, self.seed, self.name = dim, seed, name
        self.scale = 1.0 / math.sqrt(dim) if scale is None else float(scale)
        lo, hi = int(offsets[rank]), int(offsets[rank + 1])
        keys = torch.arange(lo, hi) if keys is None else torch.as_tensor(keys).cpu()
        if keys.shape != (hi - lo,):
            raise StoreError(f"embedding {name!r}: worker {rank} holds {hi - lo} rows, got "
                             f"{list(keys.shape)} keys")
        local = initial_embedding(keys, dim, seed, self.scale, dtype)
        self.register_buffer("weight", local)
        self.store = ShardedTensor(local, offsets, rank, comm, name)
        # the lookups whose rows got a gradient since the optimizer's last zero_grad: what
        # its step applies (as torch's optimizers apply a parameter's accumulated .grad)
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.steps = 0

    @classmethod
    def for_graph(cls, dg, dim: int, **kw) -> "Embedding":
        """The table of ``dg``'s nodes (a ``DistGraph``), rows sharded as its partition."""
        return cls(None, dim, offsets=dg.shard.node_offsets, rank=dg.rank,
                   comm=Comm(dg.group, timeout=dg.exchanger.timeout), **kw)

    @property
    def local(self) -> torch.Tensor:
        """This worker's rows (global ids ``offsets[rank] ..``)."""
        return self.store.local

    @property
    def num_rows(self) -> int:
        return self.store.num_rows

    @property
    def nbytes(self) -> int:
        """The bytes of this worker's rows."""
        return self.local.numel() * self.local.element_size()

    def initial_table(self, keys: torch.Tensor | None = None) -> torch.Tensor:
        """The whole initial table, as the workers drew their rows (for a reference run);
        ``keys``: each global row's key, as the workers were given theirs (default: the
        global row ids)."""
        keys = torch.arange(self.num_rows) if keys is None else keys
        return initial_embedding(keys, self.dim, self.seed, self.scale, self.local.dtype)

    def sparse_optimizer(self, name: str, lr: float) -> "_SparseOptimizer":
        """The sparse optimizer ``name`` (``sparse_adam`` or ``sparse_adagrad``) of this
        table."""
        if name not in EMBEDDING_OPTIMIZERS:
            raise StoreError(f"unknown sparse optimizer {name!r}; expected one of "
                             f"{', '.join(EMBEDDING_OPTIMIZERS)}")
        return (SparseAdam if name == "sparse_adam" else SparseAdagrad)(self, lr=lr)

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        self.store.local = self.weight  # a move (.to) makes a new buffer: the store reads it
        return out

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows of global ``ids`` [len(ids), dim]; collective (every worker calls it)."""
        rows = self.store.pull(ids, phase="embedding")
        if torch.is_grad_enabled():  # a leaf whose .grad the optimizer's step reads
            rows.requires_grad_(True)
            ids = torch.as_tensor(ids).to(torch.int64).cpu()
            rows.register_post_accumulate_grad_hook(lambda r: self._got_gradient(ids, r))
        return rows

    def _got_gradient(self, ids: torch.Tensor, rows: torch.Tensor) -> None:
        """A backward gave the lookup of ``ids`` its rows' gradient: the step applies it,
        whenever the lookup was made (before the optimizer's zero_grad too, as torch's
        optimizers see a gradient accumulated after it)."""
        if not any(r is rows for _, r in self.pending):
            self.pending.append((ids, rows))

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the lookups' gradients (each row's ``.grad`` set to None), as
        ``nn.Embedding.zero_grad`` its table's."""
        for _, r in self.pending:
            r.grad = None
        self.pending.clear()

    def take_gradient(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, gradient rows) of the lookups whose rows got a gradient since the last
        zero_grad, repeats not yet summed; kept, as torch keeps a parameter's gradient
        over a step (a second step without zero_grad applies them again)."""
        used = [(i, r.grad) for i, r in self.pending if r.grad is not None]
        if not used:
            return torch.zeros(0, dtype=torch.int64), self.local.new_zeros((0, self.dim))
        return torch.cat([i for i, _ in used]), torch.cat([g for _, g in used])

    def extra_repr(self) -> str:
        return (f"{self.num_rows}, {self.dim}, rows {self.store.lo}.."
                f"{self.store.lo + self.local.shape[0] - 1} here")


class _SparseOptimizer:
    """Shared by the sparse optimizers: gradients routed to their owners, summed, applied."""

    def __init__(self, embeddings, lr: float):
        self.embeddings = list(embeddings) if not isinstance(embeddings, Embedding) else [embeddings]
        if not self.embeddings:
            raise StoreError("a sparse optimizer needs at least one sarc Embedding")
        for e in self.embeddings:
            if not isinstance(e, Embedding):
                raise StoreError(f"sparse optimizers update sarc Embeddings, got {type(e).__name__}")
        if not lr > 0:
            raise StoreError(f"learning rate must be positive, got {lr}")
        self.lr = lr
        self.state = [self.init_state(e) for e in self.embeddings]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for e in self.embeddings:
            e.zero_grad()

    def state_dict(self) -> dict:
        """This worker's state (its rows'), and each table's step count, as plain data."""
        return {"steps": [e.steps for e in self.embeddings],
                "state": [dict(st) for st in self.state]}

    def load_state_dict(self, state: dict) -> None:
        """Put back a ``state_dict`` of the same tables and rows, in place."""
        if len(state["state"]) != len(self.state):
            raise StoreError(f"a sparse optimizer state of {len(state['state'])} tables, "
                             f"this one updates {len(self.state)}")
        for e, st, steps, saved in zip(self.embeddings, self.state, state["steps"],
                                       state["state"]):
            for k, t in st.items():
                if k not in saved or saved[k].shape != t.shape:
                    raise StoreError(f"the sparse optimizer state of {e.name!r} does not fit "
                                     f"this worker's rows ({k}: {list(t.shape)})")
                t.copy_(saved[k])
            e.steps = int(steps)

    @property
    def nbytes(self) -> int:
        """The bytes of this worker's optimizer state."""
        return sum(t.numel() * t.element_size() for st in self.state for t in st.values())

    @torch.no_grad()
    def step(self) -> None:
        for e, st in zip(self.embeddings, self.state):
            ids, grads = e.take_gradient()
            rows, vals = e.store.route(ids, grads, "add", phase="embedding_grad")
            rows, vals = coalesce(rows, vals, "add")
            # a step where a backward reached a lookup on some worker, even of no rows, as
            # torch steps a table whose .grad is set (empty too)
            if not _any_worker(e.store, any(r.grad is not None for _, r in e.pending)):
                continue
            e.steps += 1
            self.update(e, st, rows, vals)


def _any_worker(store: ShardedTensor, flag: bool) -> bool:
    """Whether ``flag`` holds on any worker (collective with several workers)."""
    if store.size == 1:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int64, device=store.comm.device)
    dist.all_reduce(t, group=store.comm.group)
    return bool(t.item())


class SparseAdagrad(_SparseOptimizer):
    """``torch.optim.Adagrad`` on sparse gradients, each row on its owner."""

    def __init__(self, embeddings, lr: float = 0.01, eps: float = 1e-10):
        self.eps = eps
        super().__init__(embeddings, lr)

    def init_state(self, e: Embedding):
        return {"sum": torch.zeros_like(e.local)}

    def update(self, e: Embedding, st, rows, g) -> None:
        st["sum"].index_add_(0, rows, g * g)
        std = st["sum"].index_select(0, rows).sqrt_().add_(self.eps)
        e.local.index_add_(0, rows, g / std, alpha=-self.lr)


class SparseAdam(_SparseOptimizer):
    """``torch.optim.SparseAdam``: lazy moments of the touched rows, each row on its owner."""

    def __init__(self, embeddings, lr: float = 0.001, betas=(0.9, 0.999), eps: float = 1e-8):
        self.betas, self.eps = betas, eps
        super().__init__(embeddings, lr)

    def init_state(self, e: Embedding):
        return {"m": torch.zeros_like(e.local), "v": torch.zeros_like(e.local)}

    def update(self, e: Embedding, st, rows, g) -> None:
        b1, b2 = self.betas
        m_old, v_old = st["m"].index_select(0, rows), st["v"].index_select(0, rows)
        dm = (g - m_old).mul_(1 - b1)
        dv = (g * g - v_old).mul_(1 - b2)
        st["m"].index_add_(0, rows, dm)
        st["v"].index_add_(0, rows, dv)
        numer = dm.add_(m_old)
        denom = dv.add_(v_old).sqrt_().add_(self.eps)
        step_size = self.lr * math.sqrt(1 - b2 ** e.steps) / (1 - b1 ** e.steps)
        e.local.index_add_(0, rows, numer.div_(denom), alpha=-step_size)
