"""The block statistics ``sarc compile --mode mfg|sampling --partition DIR`` plans with.

A minibatch layer runs on its own blocks (``sarc.sampling``), whose sizes depend on the
step's seeds; the planner takes them as a ``BlockSample``: per sampled batch, per layer,
the ``ShardStats`` of the layer's blocks over the P workers. They are measured, not
modelled: the P workers' shards are built from the partition set, the trainer's
``SeedBatches`` deals each worker its seeds of a step (``batch_size`` over all workers)
and its ``NeighbourSampler`` samples the batch, exactly as in training.

The sampler is collective (the closure crosses shards; every worker takes part in every
exchange), so the P workers run at once, as P threads of this process. They talk
through ``ThreadComm``, the collectives of ``sarc.sampling.comm.Comm`` over shared
memory (a barrier and a slot per worker): the sampler's code and the ids it exchanges
are those of a gloo run, without P processes to start or ports to open. (A gloo group
needs a process per rank: torch.distributed keeps one default group per process.)
"""
from __future__ import annotations

import math
import queue
import threading

import torch

from ..distributed.exchange import Exchanger
from ..planner.stats import BlockSample, ShardStats
from ..runtime.sharded import ShardedGraph
from ..sampling import NeighbourSampler, SamplingError, SamplingSpec
from ..sampling.comm import stop_with
from ..training.minibatch import MiniBatchConfig, SeedBatches

WAIT_S = 600.0
"""How long a worker thread waits for its peers at a collective before giving up."""


FIRST_EPOCH = 1
"""The epoch a training run starts with (``sarc.training.loop.fit`` counts from 1): its
first steps are the ones sampled."""


class _Hub:
    """What P worker threads share: a barrier, one slot per worker, and a mailbox per
    (sender, receiver, tag) for point-to-point transfers (``ThreadExchanger``)."""

    def __init__(self, size: int):
        self.size = size
        self.barrier = threading.Barrier(size, timeout=WAIT_S)
        self.slots: list = [None] * size
        self.lock = threading.Lock()
        self.mailboxes: dict[tuple[int, int, int], queue.Queue] = {}

    def mailbox(self, frm: int, to: int, tag: int) -> queue.Queue:
        with self.lock:
            return self.mailboxes.setdefault((frm, to, tag), queue.Queue())


class ThreadComm:
    """``sarc.sampling.Comm``'s collectives between the P threads of one process (worker
    ``rank`` of ``hub``'s): every worker puts its part in its slot, all meet at the
    barrier, each reads the others' parts, all meet again before the next collective."""

    distributed = False
    group = None
    timeout = None
    device = torch.device("cpu")

    def __init__(self, hub: _Hub, rank: int):
        self.hub, self.rank, self.size = hub, rank, hub.size
        self.rows_received: dict[str, int] = {}

    def _swap(self, mine) -> list:
        hub = self.hub
        hub.slots[self.rank] = mine
        hub.barrier.wait()
        everyone = list(hub.slots)
        hub.barrier.wait()
        return everyone

    def all_gather(self, values: list[int]) -> list[list[int]]:
        return [list(v) for v in self._swap([int(v) for v in values])]

    def gather_objects(self, obj) -> list:
        """Every worker's ``obj``, by rank (shared, not copied)."""
        return self._swap(obj)

    def agree(self, problem: str | None) -> None:
        stop_with(problem, [q is not None for q in self._swap(problem)])

    def exchange(self, outgoing: list[torch.Tensor], sizes: list[int] | None = None,
                 kind: str = "ids") -> list[torch.Tensor]:
        r, p = self.rank, self.size
        if len(outgoing) != p:
            raise SamplingError(f"an exchange needs one tensor per worker ({p}), got {len(outgoing)}")
        sent = self._swap(list(outgoing))
        incoming = [outgoing[r] if j == r else sent[j][r].clone() for j in range(p)]
        self.rows_received[kind] = self.rows_received.get(kind, 0) + sum(
            int(t.shape[0]) for j, t in enumerate(incoming) if j != r)
        return incoming


class _Sent:
    """A send between threads: done when posted."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor

    def wait(self) -> torch.Tensor:
        return self.tensor


class _Receiving:
    """A receive between threads: the sender's tensor, when it comes."""

    def __init__(self, box: queue.Queue, frm: int):
        self.box, self.frm = box, frm

    def wait(self) -> torch.Tensor:
        try:
            return self.box.get(timeout=WAIT_S)
        except queue.Empty:
            raise SamplingError(f"worker {self.frm} sent nothing in {WAIT_S:.0f} s") from None


class ThreadExchanger(Exchanger):
    """``sarc.distributed.exchange.Exchanger``'s point-to-point transfers between the P
    threads of ``run_threads`` (worker ``comm.rank``), so that a worker's setup code
    (``sarc.distributed.prepare.with_self_loops``) runs here as it runs in training."""

    makes_groups = False   # the threads' messages go through the hub's mailboxes, by tag

    def __init__(self, comm: ThreadComm):
        super().__init__(comm.rank, comm.size)
        self.hub = comm.hub

    def send(self, tensor, to, tag, phase):
        tensor = tensor.contiguous().clone()
        self.hub.mailbox(self.rank, to, tag).put(tensor)
        self.counter.add_sent(phase, tensor.numel() * tensor.element_size())
        return _Sent(tensor)

    def recv(self, shape, dtype, device, frm, tag, phase):
        self.counter.add_received(phase, math.prod(shape) * torch.empty((), dtype=dtype).element_size())
        return _Receiving(self.hub.mailbox(frm, self.rank, tag), frm)


def with_self_loops(shards: list[ShardedGraph], reads=()) -> list[ShardedGraph]:
    """The P workers' ``shards`` with their self loops replaced by one per node, as each
    worker of a training run replaces them when the model's ``self_loops`` is set
    (``sarc.distributed.prepare.with_self_loops``, run on P threads)."""
    from ..distributed.prepare import with_self_loops as worker_self_loops
    return run_threads(len(shards), lambda rank, comm: worker_self_loops(
        shards[rank], ThreadExchanger(comm), reads))


def run_threads(size: int, work) -> list:
    """``work(rank, comm)`` on ``size`` worker threads joined by ``ThreadComm``s; the results
    by rank. A worker's error stops its peers (their barrier breaks) and is raised here."""
    hub = _Hub(size)
    results: list = [None] * size
    errors: list = [None] * size

    def run(rank: int) -> None:
        try:
            results[rank] = work(rank, ThreadComm(hub, rank))
        except BaseException as e:  # noqa: BLE001 (re-raised below, in the caller's thread)
            errors[rank] = e
            hub.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,), name=f"sampling-worker-{r}")
               for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = next((e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)),
                 next((e for e in errors if e is not None), None))
    if first is not None:
        raise first
    return results


def sample_blocks(shards: list[ShardedGraph], spec: SamplingSpec, *, batch_size: int | None,
                  batches: int, mask: str = "train_mask", epoch: int = FIRST_EPOCH) -> BlockSample:
    """The block statistics of the first ``batches`` steps of ``epoch`` (fewer if the epoch
    has fewer) on the P workers' ``shards`` (rank order; ``ShardedGraph.from_partitions``):
    the training steps' seeds, ``batch_size`` per step over all workers (None: all of them
    in one step, as ``sarc train`` by default) from the labeled nodes of ``mask``, sampled
    per ``spec`` (``SamplingSpec.mfg``: every in-edge)."""
    return sample_epoch(shards, spec, batch_size=batch_size, batches=batches, mask=mask,
                        epoch=epoch)[0]


def sample_epoch(shards: list[ShardedGraph], spec: SamplingSpec, *, batch_size: int | None,
                 batches: int, mask: str = "train_mask",
                 epoch: int = FIRST_EPOCH) -> tuple[BlockSample, int]:
    """``sample_blocks``'s sample, and the steps of the whole epoch (more than the sample's
    batches where ``batches`` cut it short, fewer where the epoch has fewer). The sample's
    ``batch_size`` is the one the steps took (``batch_size``, or every seed)."""
    p = len(shards)
    config = MiniBatchConfig("mfg", batch_size=batch_size)  # the seeds: the same in each mode
    taken: list = [None, None]

    def work(rank: int, comm: ThreadComm) -> list:
        nd = shards[rank].ndata
        train = nd[mask].to(torch.bool)
        if nd.get("label") is not None and nd["label"].dim() == 1:
            # a label < 0 is none: the trainer's seeds are labeled nodes (labeled_masks)
            train = train & (nd["label"] >= 0)
        loader = SeedBatches(shards[rank], train, config, spec.seed, comm)
        sampler = NeighbourSampler(shards[rank], spec, comm)
        if rank == 0:
            taken[:] = [loader.batch_size, loader.steps]
        out = []
        for step, (seeds, _) in enumerate(loader.epoch(epoch)):
            if step == batches:
                break
            blocks = comm.gather_objects([b.shard for b in sampler.sample(seeds, epoch).blocks])
            if rank == 0:
                out.append(tuple(ShardStats.from_shards([blocks[r][k] for r in range(p)])
                                 for k in range(spec.num_layers)))
        return out

    measured = run_threads(p, work)[0]
    if not measured:
        raise SamplingError(f"no labeled seed nodes in {mask!r}: the sample has no batch to "
                            f"measure")
    fanouts = None if all(f == -1 for f in spec.fanouts) else spec.fanouts
    return BlockSample(tuple(measured), taken[0], fanouts), taken[1]
