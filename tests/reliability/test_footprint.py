"""What a distributed run leaves in ``TMPDIR`` when nothing goes wrong: nothing. Beside
sarc's and torchrun's own directories (``test_faults.leftovers``), torch's compiler makes
a ``torchinductor_<user>`` cache directory as it is imported, which a CPU worker has no
use for (``sarc.training.optim``)."""
from __future__ import annotations

import json
import os

import torch

from sarc.partition import partition_graph

from .catalogue import case
from .harness import ROOT, run_sarc


def _parts(path, n: int = 60):
    gen = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, n, (300,), generator=gen), torch.randint(0, n, (300,), generator=gen)
    node_data = {"feat": torch.rand(n, 5, generator=gen),
                 "label": torch.randint(0, 3, (n,), generator=gen),
                 "train_mask": torch.ones(n, dtype=torch.bool),
                 "val_mask": torch.zeros(n, dtype=torch.bool),
                 "test_mask": torch.zeros(n, dtype=torch.bool)}
    return partition_graph(src, dst, n, 2, path, method="random", node_data=node_data,
                           seed=0).path


@case("faults", "`sarc train --workers 2` that ends well: nothing of torch's compiler "
      "in TMPDIR", "no-orphans")
def test_a_run_leaves_no_compiler_cache_in_tmpdir(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    report = tmp_path / "report.json"
    proc = run_sarc("train", ROOT / "models" / "gcn.py", "--partition", _parts(tmp_path / "parts"),
                    "--epochs", "2", "--workers", "2", "--json", report,
                    env={"TMPDIR": str(tmp), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert [w["rank"] for w in json.loads(report.read_text())["per_worker"]] == [0, 1]
    assert sorted(os.listdir(tmp)) == []
