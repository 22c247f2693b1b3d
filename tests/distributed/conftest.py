"""The distributed test matrix, run once per session in one group of worker processes."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from filelock import FileLock

import sarc
from sarc.backends import triton_backend
from sarc.partition import partition_graph

from .harness import Case, run_cases, step
from .models import MODELS

N, E, FEATS, CLASSES, RELS = 90, 600, 10, 4, 3


def _no_triton() -> str | None:
    """Why this environment does not run Triton's kernels (the DGL environment's 2.2), or
    None where it does."""
    try:
        triton_backend.check_triton()
    except triton_backend.TritonUnavailable as e:
        return str(e)
    return None


NO_TRITON = _no_triton()


def _graph():
    """Random directed multigraph; the last 6 nodes have no edges at all (their aggregates
    are 0 and their outputs come from the update alone)."""
    gen = torch.Generator().manual_seed(7)
    src = torch.randint(0, N - 6, (E,), generator=gen)
    dst = torch.randint(0, N - 6, (E,), generator=gen)
    data = {
        "float": torch.randn(N, FEATS, generator=gen),
        "int": torch.randint(-2, 3, (N, FEATS), generator=gen).float(),  # ties for max
    }
    label = torch.randint(0, CLASSES, (N,), generator=gen)
    train = torch.rand(N, generator=gen) < 0.6
    etype = torch.randint(0, RELS, (E,), generator=gen)
    return src, dst, data, label, train, etype


def _cases() -> list[Case]:
    cases = [Case("gcn_p1", "gcn", 1)]
    # every model at P = 2 and 4 in sar mode, METIS or random partitions
    for model in ("gcn", "sage", "gat", "gin", "rgcn", "max"):
        cases.append(Case(f"{model}_p2_sar", model, 2, "metis" if model != "sage" else "random"))
    for model, method in (("gcn", "metis"), ("gcn", "random"), ("gat", "metis"), ("gat", "random"),
                          ("sage", "random"), ("gin", "random"), ("rgcn_bases", "metis"),
                          ("max", "random")):
        cases.append(Case(f"{model}_p4_sar_{method}", model, 4, method))
    # each execution mode for GCN and GAT at P = 3
    for model in ("gcn", "gat"):
        cases.append(Case(f"{model}_p3_sar", model, 3, exec_mode="sar"))
        cases.append(Case(f"{model}_p3_oneshot", model, 3, exec_mode="oneshot"))
        cases.append(Case(f"{model}_p3_hybrid", model, 3, exec_mode="hybrid", hybrid_budget=True))
    # unfused edge_softmax (a normalizer pass, forward and backward), baseline mode,
    # max ties across blocks, parameterized messages kept in oneshot
    cases += [
        Case("gat_attn_drop_p3_sar", "gat_attn_drop", 3, eval_mode=True),
        Case("gat_attn_drop_p3_oneshot", "gat_attn_drop", 3, exec_mode="oneshot", eval_mode=True),
        Case("gcn_p3_baseline", "gcn", 3, baseline=True),
        Case("gat_p3_baseline", "gat", 3, baseline=True),
        Case("tied_max_p3_sar", "tied_max", 3, "random", extra={"feat": "int"}),
        Case("score_shapes_p3_sar", "score_shapes", 3, "random"),
        Case("feature_axes_p3_sar", "feature_axes", 3, "random"),
        Case("feature_axes_p2_oneshot", "feature_axes", 2, exec_mode="oneshot"),
        Case("rgcn_p3_oneshot", "rgcn", 3, "random", exec_mode="oneshot"),
        Case("degrees_p3_sar", "degrees", 3, "random"),
        Case("degrees_p2_oneshot", "degrees", 2, exec_mode="oneshot"),
        Case("degrees_p3_baseline", "degrees", 3, baseline=True),
        # features without a gradient: GraphSAGE's first layer has no gradient through its
        # edges (no backward pass over the blocks); the baseline GAT's exchanged rows need none
        Case("sage_p3_x_nograd", "sage", 3, x_grad=False),
        Case("gat_p3_baseline_x_nograd", "gat", 3, baseline=True, x_grad=False),
        # a parameter named as the feature it reads, the feature without a gradient
        Case("same_names_p3_x_nograd", "same_names", 3, "random", x_grad=False),
        # scores masked to -inf (a block's max of -inf), an edge_softmax of another's weights
        Case("masked_p3_sar", "masked", 3, "random"),
        Case("masked_p2_oneshot", "masked", 2, exec_mode="oneshot"),
        Case("masked_p3_baseline", "masked", 3, baseline=True),
        *([Case("masked_p2_triton", "masked_triton", 2, "random"),
           # scores far from zero: the blocks' statistics in float64 of the scores as the
           # layer computes them (float32), not of scores computed again in float64
           Case("masked_far_p2_triton", "masked_far_triton", 2, "random"),
           Case("masked_far_p3_triton_baseline", "masked_far_triton", 3, "random",
                baseline=True)] if NO_TRITON is None else []),
        Case("nested_sum_p3_sar", "nested_sum", 3, "random"),
        # a message of both ends under a max, its linear computed at the nodes
        Case("edgeconv_p3_sar", "edgeconv", 3, "random"),
        Case("edgeconv_p2_oneshot", "edgeconv", 2, exec_mode="oneshot"),
        # dot-product scores, one SDDMM of the two ends' rows per block
        Case("dot_p3_sar", "dot", 3, "random"),
        Case("dot_p2_oneshot", "dot", 2, exec_mode="oneshot"),
        Case("dot_p2_baseline", "dot", 2, baseline=True),
    ]
    # messages of at most 4 rows: every remote block in several pieces, whose partial
    # aggregates (sums, maxima with ties, online softmax, normalizers) merge exactly
    cases += [Case(f"{name}_chunked", model, parts, method, chunk_rows=4, **kw)
              for name, model, parts, method, kw in (
                  ("gcn_p3_sar", "gcn", 3, "metis", {}),
                  ("sage_p3_oneshot", "sage", 3, "random", {"exec_mode": "oneshot"}),
                  ("gat_p3_sar", "gat", 3, "metis", {}),
                  ("gat_p3_hybrid", "gat", 3, "metis", {"exec_mode": "hybrid",
                                                        "hybrid_budget": True}),
                  ("gat_attn_drop_p3_sar", "gat_attn_drop", 3, "metis", {"eval_mode": True}),
                  ("gat_p3_baseline", "gat", 3, "random", {"baseline": True}),
                  ("tied_max_p3_sar", "tied_max", 3, "random", {"extra": {"feat": "int"}}),
                  ("rgcn_p3_oneshot", "rgcn", 3, "random", {"exec_mode": "oneshot"}),
                  ("gin_p4_sar", "gin", 4, "random", {}),
                  ("masked_p3_sar", "masked", 3, "metis", {}),
                  ("nested_sum_p2_oneshot", "nested_sum", 2, "random", {"exec_mode": "oneshot"}),
              )]
    return cases


def planned_steps(cases: list[Case], work, make_model, relational) -> tuple[dict, dict]:
    """Per case: what its workers need (partition of ``_graph``, the model's initial state)
    and the single-process step they must equal; ``make_model(case)`` builds its model,
    ``relational(case)``: whether it reads the relation ids."""
    src, dst, feats, label, train, etype = _graph()
    g = sarc.Graph.from_edges(src, dst, N)
    partitions: dict = {}
    specs, refs = {}, {}
    for case in cases:
        kind = case.extra.get("feat", "float")
        key = (case.parts, case.method, kind)
        if key not in partitions:
            node_data = {"feat": feats[kind], "label": label, "train_mask": train}
            partitions[key] = str(partition_graph(
                src, dst, N, case.parts, work / f"parts-{case.parts}-{case.method}-{kind}",
                method=case.method, node_data=node_data, edge_data={"etype": etype}).path)
        torch.manual_seed(0)
        model = make_model(case)
        specs[case.name] = {"partition": partitions[key], "model_args": (FEATS, CLASSES),
                            "state": {k: v.clone() for k, v in model.state_dict().items()},
                            "num_train": int(train.sum()), "relational": relational(case)}
        if case.eval_mode:
            model.eval()
        x = feats[kind].clone().requires_grad_(case.x_grad)
        torch.manual_seed(0)
        logits, loss = step(model, g, x, label, train, int(train.sum()),
                            {"etype": etype} if relational(case) else {})
        assert torch.allclose(loss, F.cross_entropy(logits[train], label[train]))
        refs[case.name] = {"logits": logits.detach(), "x_grad": x.grad, "loss": float(loss.detach()),
                           "param_grads": {k: p.grad.clone() for k, p in model.named_parameters()
                                           if p.grad is not None}}
    return specs, refs


def _run_matrix(work) -> tuple[dict, Path]:
    cases = _cases()
    specs, refs = planned_steps(cases, work, lambda c: MODELS[c.model](FEATS, CLASSES),
                                lambda c: c.model.startswith("rgcn"))
    return refs, run_cases(cases, specs, work)


@pytest.fixture(scope="session")
def dist_results(tmp_path_factory, worker_id):
    """(cases by name, single-process references, results folder). Under pytest-xdist the
    matrix runs once for the whole session: the first worker to ask runs it in the run's
    shared folder, the others wait for it and read what it left."""
    cases = {c.name: c for c in _cases()}
    if worker_id == "master":
        return (cases, *_run_matrix(tmp_path_factory.mktemp("dist")))
    shared = tmp_path_factory.getbasetemp().parent   # this run's, shared by its workers
    done = shared / "dist-matrix.pt"
    with FileLock(str(shared / "dist-matrix.lock")):
        if not done.exists():
            work = shared / "dist-matrix"
            work.mkdir()
            refs, out = _run_matrix(work)
            torch.save({"refs": refs, "out": str(out)}, done)
    saved = torch.load(done, weights_only=False)
    return cases, saved["refs"], Path(saved["out"])
