"""Bad requests to a sharded tensor on several workers stop every worker with the error,
none is left waiting in the exchange."""
from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from .catalogue import case

P = 2


def _worker(rank, port, q):
    from sarc.distributed.store import ShardedTensor
    from sarc.sampling import Comm
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=P, timeout=datetime.timedelta(seconds=30))
    st = ShardedTensor(torch.zeros(5, 2), torch.tensor([0, 5, 10]), rank,
                       Comm(timeout=datetime.timedelta(seconds=30)), "feat")
    try:
        st.pull(torch.tensor([3, 12]) if rank == 1 else torch.tensor([7]))
        q.put((rank, "no error"))
    except Exception as e:  # noqa: BLE001 - the test reads what each worker raised
        q.put((rank, f"{type(e).__name__}: {e}"))


@case("faults", "a sharded-tensor pull of an id out of range on one of 2 workers", "error")
def test_a_bad_id_on_one_worker_stops_both():
    from distributed.harness import spawn
    codes, reports = spawn(_worker, P, (), timeout_s=60)
    assert codes == [0, 0], reports
    assert "id 12 is out of range for 'feat' (10 rows)" in reports[1]
    assert "worker 1 could not go on" in reports[0]
