"""``sarc compile --partition DIR`` plans what ``sarc train --partition DIR`` then runs: the
bytes it predicts a step sends equal what the training workers' counters count, worker
by worker, and its schedules send gradients where the step's layers need them.

The cases are those where the two once parted: layers declared in another order than
the forward pass calls them, a learned embedding input (whose rows need the first
layer's input gradient), and a model that adds self loops to every shard (whose
sampled fanouts draw a self loop). A partition of another graph than the model's
dataset is refused.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from sarc.cli import main
from sarc.datasets import load_dataset
from model_files import MEAN
from timeouts import run_or_show_stacks

pytestmark = pytest.mark.once   # end to end, DGL-free: the main environment's run (Makefile)

ROOT = Path(__file__).resolve().parents[2]


def _sarc(*argv) -> None:
    proc = run_or_show_stacks([sys.executable, "-m", "sarc.cli", *map(str, argv)], cwd=ROOT,
                              timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


def _parts(tmp_path_factory, dataset: str) -> Path:
    out = tmp_path_factory.mktemp(dataset) / "parts"
    assert main(["partition", "--dataset", dataset, "--parts", "2", "--method", "random",
                 "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def cora_parts(tmp_path_factory):
    return _parts(tmp_path_factory, "cora")


@pytest.fixture(scope="module")
def aifb_parts(tmp_path_factory):
    return _parts(tmp_path_factory, "aifb")


@pytest.fixture(scope="module")
def typed_parts(tmp_path_factory) -> tuple[Path, Path]:
    """A small graph of 10 relations over 2 node types (each relation's destinations of one
    type), 8 features, 2 random parts: AIFB's kinds of data, at a size whose 20 relation
    layers compile and train in a few seconds. Returns (the parts, the graph file)."""
    gen = np.random.default_rng(0)
    n, rels, per = 900, 10, 400
    ntype = (np.arange(n) % 3 == 0).astype(np.int64)
    dst = [gen.choice(np.flatnonzero(ntype == r % 2), per) for r in range(rels)]
    idx = np.arange(n)
    graph = tmp_path_factory.mktemp("typed") / "typed.npz"
    np.savez(graph, edge_src=gen.integers(0, n, rels * per), edge_dst=np.concatenate(dst),
             etype=np.repeat(np.arange(rels), per), num_etypes=np.int64(rels), ntype=ntype,
             num_ntypes=np.int64(2), num_nodes=np.int64(n),
             feat=gen.random((n, 8)).astype(np.float32), label=gen.integers(0, 3, n),
             num_classes=np.int64(3), train_mask=idx % 5 < 2, val_mask=idx % 5 == 2,
             test_mask=idx % 5 > 2)
    parts = graph.parent / "parts"
    assert main(["partition", "--graph", str(graph), "--parts", "2", "--method", "random",
                 "--out", str(parts)]) == 0
    return parts, graph


@pytest.fixture(scope="module")
def gcn_reversed(tmp_path_factory) -> Path:
    """models/gcn.py with ``conv2`` assigned before ``conv1`` in ``__init__`` (forward as it
    is: conv1, then conv2)."""
    text = (ROOT / "models" / "gcn.py").read_text()
    first = "        self.conv1 = GCNLayer(in_feats, hidden)\n"
    second = "        self.conv2 = GCNLayer(hidden, num_classes)\n"
    assert first + second in text
    path = tmp_path_factory.mktemp("model") / "gcn_rev.py"
    path.write_text(text.replace(first + second, second + first))
    return path


def _compiled(tmp_path, model, parts, *options) -> tuple[dict, str]:
    out = tmp_path / "compiled"
    assert main(["compile", str(model), "--partition", str(parts), *options,
                 "--emit", "plan,schedule", "--out", str(out)]) == 0
    return json.loads((out / "plan.json").read_text()), (out / "schedule.txt").read_text()


def _predicted(plan: dict) -> list[int]:
    """Per worker, the bytes compile predicts one step sends (a minibatch mode: the mean
    step of the sampled batches, which must be the whole epoch, as sarc train reports)."""
    p = plan["workers"]
    if plan["mode"] == "full":   # the layers' and the HeteroConvs' fetches of their inputs
        return [sum(lp["bytes_sent_per_worker"][r]
                    for lp in (*plan["layers"], *plan.get("fetches", ()))) for r in range(p)]
    per_batch = [lp["batches"]["bytes_sent_per_step"]["per_batch"]
                 for lp in (*plan["layers"], *plan.get("fetches", ()))]
    steps = len(per_batch[0])
    return [sum(b[r] for layer in per_batch for b in layer) // steps for r in range(p)]


def _kept(plan: dict) -> list[int]:
    """Per worker, the bytes compile plans a full-batch step keeps for backward."""
    return [sum(lp["bytes_kept_per_worker"][r] for lp in (*plan["layers"],
                                                           *plan.get("fetches", ())))
            for r in range(plan["workers"])]


def _counted(tmp_path, model, parts, *options) -> tuple[list[int], dict]:
    out = tmp_path / "train.json"
    _sarc("train", model, "--partition", parts, "--workers", "2", "--epochs", "1", *options,
          "--json", out)
    run = json.loads(out.read_text())
    return [w["step_bytes_sent"] for w in run["per_worker"]], run


def _layers(schedule: str) -> list[tuple[str, bool]]:
    """(layer, whether its backward sends gradients back) of each layer in schedule.txt."""
    out = []
    for block in schedule.split("\nlayer ")[1:]:
        out.append((block.split()[0], "send their gradients back" in block))
    return out


@pytest.mark.parametrize("options", [("--baseline",), ("--mode", "mfg", "--batch-size", "32")],
                         ids=["full-baseline", "mfg"])
def test_layers_in_call_order_not_declaration_order(tmp_path, cora_parts, gcn_reversed,
                                                    options):
    plan, schedule = _compiled(tmp_path, gcn_reversed, cora_parts, *options)
    # conv1 runs first (on the input block); with --baseline its raw input rows cross,
    # which need no gradient (without, its projected rows cross, whose gradients do)
    assert [lp["name"] for lp in plan["layers"]] == ["conv1", "conv2"]
    if "--baseline" in options:
        assert _layers(schedule) == [("conv1", False), ("conv2", True)]
    counted, _ = _counted(tmp_path, gcn_reversed, cora_parts, *options)
    assert _predicted(plan) == counted
    assert all(c > 0 for c in counted)


def test_a_learned_embedding_needs_the_first_layers_input_gradient(tmp_path, aifb_parts):
    """R-GCN on AIFB: a featureless graph, whose embedding rows are the first layer's
    input and get its gradient (sent back across the exchange with --baseline)."""
    parts = aifb_parts
    model = ROOT / "models" / "rgcn.py"
    plan, schedule = _compiled(tmp_path, model, parts, "--baseline")
    assert [need for _, need in _layers(schedule)] == [True, True]
    assert all(lp["exchange"]["needs_grad"] for lp in plan["layers"])
    counted, _ = _counted(tmp_path, model, parts, "--baseline")
    assert _predicted(plan) == counted


def _typed(typed_parts, *options) -> tuple[Path, tuple]:
    """The typed graph's parts, and ``options`` naming its graph file."""
    parts, graph = typed_parts
    return parts, ("--dataset", str(graph), *options)


@pytest.mark.parametrize("graph,budget", [("aifb", None), ("typed", 2 ** 20)],
                         ids=["none", "fits"])
def test_a_hetero_convs_relations_are_planned_as_they_run(tmp_path, request, graph, budget):
    """A HeteroConv of 90 relations on AIFB without a memory budget, or on the typed graph
    under one its fetched rows fit (all layers keep 894 KiB a worker, their own shards'
    844 KiB): each conv fetches its input's boundary rows once (a fetch per conv, its
    relations' layers exchanging nothing), as compile plans it."""
    model = ROOT / "models" / "hetero_sage.py"
    if graph == "aifb":
        parts, options = request.getfixturevalue("aifb_parts"), ()
    else:
        parts, options = _typed(request.getfixturevalue("typed_parts"),
                                "--mem-budget", str(budget))
    plan, schedule = _compiled(tmp_path, model, parts, *options)
    # a featureless graph's model is wrapped with its learned embedding (model.)
    assert [f["name"].removeprefix("model.") for f in plan["fetches"]] == ["conv1.input0",
                                                                          "conv2.input0"]
    assert {lp["exec_mode"] for lp in plan["layers"]} == {"halo"}
    assert f"fetch {plan['fetches'][0]['name']} (halo)" in schedule
    # the second epoch's step: the first one's also finds the relations' degrees (set-up)
    counted, run = _counted(tmp_path, model, parts, "--epochs", "2", *options)
    assert all(c > 0 for c in counted)
    assert [w["planned_step_bytes_sent"] for w in run["per_worker"]] == counted
    assert _predicted(plan) == counted
    # what a step keeps: the fetched rows and each relation's layer's share of its shard
    # (the workers counted the fetches alone)
    kept = _kept(plan)
    assert [w["planned_step_bytes_kept"] for w in run["per_worker"]] == kept
    if budget:
        assert max(kept) <= budget
        assert not any(w["over_budget"] for w in run["per_worker"])


@pytest.mark.parametrize("mode", [("--mode", "mfg"),
                                  ("--mode", "sampling", "--fanouts", "5,5", "--batch-size", "60")],
                         ids=["mfg", "sampling"])
def test_a_hetero_convs_fetches_on_sampled_blocks_are_planned_as_they_run(tmp_path, typed_parts,
                                                                         mode):
    """On a mini-batch step's blocks each conv fetches its input's rows of its block once
    for its relations: compile prices each fetch on every sampled batch's block, which are
    the epoch's steps (compile samples 8, the typed graph's epoch 6 of 60 seeds), as the
    workers count them."""
    model = ROOT / "models" / "hetero_sage.py"
    parts, mode = _typed(typed_parts, *mode)
    plan, schedule = _compiled(tmp_path, model, parts, *mode)
    # a featureless graph's model is wrapped with its learned embedding (model.)
    assert [f["name"].removeprefix("model.") for f in plan["fetches"]] == ["conv1.input0",
                                                                          "conv2.input0"]
    assert {lp["exec_mode"] for lp in plan["layers"]} == {"halo"}
    assert all(f["batches"]["bytes_sent_per_step"]["max"] > 0 for f in plan["fetches"])
    counted, run = _counted(tmp_path, model, parts, *mode)
    assert all(c > 0 for c in counted)
    assert [w["planned_step_bytes_sent"] for w in run["per_worker"]] == counted
    assert _predicted(plan) == counted


@pytest.mark.parametrize("options", [("--exec", "sar"), ("--mem-budget", "870KiB"),
                                     ("--exec", "hybrid", "--mem-budget", "870KiB")],
                         ids=["sar", "budget", "hybrid"])
def test_a_hetero_convs_relations_with_their_own_schedules_are_planned_on_their_edges(
        tmp_path, typed_parts, options):
    """In sar, or under a memory budget its fetched rows do not fit, each relation's layer
    runs a schedule of its own on its relation's sub-graph of the shards, exchanging the
    rows its edges read: compile plans each on its relation's edges, as the workers do
    (not on the whole shards'). In hybrid some relations' layers keep their peers' rows:
    compile shares the budget as the workers share it before their first step (it read
    each call's input-gradient need, and conv1's input, a TypedInput's output, needs one).
    The typed graph's layers keep 844 KiB a worker of their own shards and 894 KiB with
    the fetched rows: at 870 KiB the fetches do not fit, some relations' layers keep rows."""
    model = ROOT / "models" / "hetero_sage.py"
    parts, options = _typed(typed_parts, *options)
    plan, _ = _compiled(tmp_path, model, parts, *options)
    assert not plan.get("fetches") and "halo" not in {lp["exec_mode"] for lp in plan["layers"]}
    if "870KiB" in options:   # some relations' layers keep their peer's rows, some do not
        assert len({bool(any(lp["kept_peers"])) for lp in plan["layers"]}) == 2
        # within the budget; the fetches (planned without one) would not have fit it
        halo, _ = _compiled(tmp_path / "halo", model, parts, *options[:2])
        assert max(_kept(plan)) <= 870 * 2 ** 10 < min(_kept(halo))
    counted, run = _counted(tmp_path, model, parts, "--epochs", "2", *options)
    assert all(c > 0 for c in counted)
    assert [w["planned_step_bytes_sent"] for w in run["per_worker"]] == counted
    assert _predicted(plan) == counted


def test_a_hetero_conv_called_twice_keeps_two_fetches_as_compile_says(tmp_path, typed_parts,
                                                                      capsys):
    """A HeteroConv called twice in a step under a budget one call's fetch fits (the
    decision prices a fetch per conv): each call fetches and keeps its rows and its
    relations' layers' shares, so the step keeps more than the budget. Compile and the
    workers count the same bytes kept (the workers counted the fetches alone) and both
    say why the step is over (they said every layer ran in sar, nothing remote kept)."""
    text = (ROOT / "models" / "hetero_sage.py").read_text()
    call = "        h = F.relu(self.conv1(g, h, etype=etype, ntype=ntype))\n"
    assert text.count(call) == 1
    model = tmp_path / "conv_twice.py"
    model.write_text(text.replace(call, call + call))
    parts, options = _typed(typed_parts, "--mem-budget", "900KiB")
    capsys.readouterr()
    plan, _ = _compiled(tmp_path, model, parts, *options)
    said = capsys.readouterr().out
    assert [f["name"] for f in plan["fetches"]] == ["conv1.input0", "conv1#2.input0",
                                                    "conv2.input0"]
    kept = _kept(plan)
    assert min(kept) > 900 * 2 ** 10
    assert "over the budget on workers [0, 1]: the rows its HeteroConvs fetched once" in said
    out = tmp_path / "train.json"
    proc = run_or_show_stacks([sys.executable, "-m", "sarc.cli", "train", str(model),
                               "--partition", str(parts), "--workers", "2", "--epochs", "1",
                               *options, "--json", str(out)], cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads(out.read_text())
    assert [w["planned_step_bytes_kept"] for w in run["per_worker"]] == kept
    assert all(w["over_budget"] and w["fetched_once"] for w in run["per_worker"])
    assert "for backward: the rows its HeteroConvs fetched once" in proc.stdout


def test_relations_sharing_a_layer_over_edge_types_the_model_makes(tmp_path, typed_parts):
    """One layer object for every relation of a conv (weight sharing), and edge types the
    model derives from the partition's (``etype + 7``): each relation call is planned on
    its own edges of the shards, by the edge types its conv was given (it was planned on
    one relation's, and on the partition's edge types), and the workers plan each relation's
    sub-graph apart (they reused the first relation's plan)."""
    text = (ROOT / "models" / "hetero_sage.py").read_text()
    for old, new in [
            ("        self.conv1 = sarc.HeteroConv({r: SAGELayer(hidden, hidden) for r in "
             "range(num_etypes)},",
             "        shared = SAGELayer(hidden, hidden)\n"
             "        self.conv1 = sarc.HeteroConv({r: shared for r in "
             "reversed(range(7, num_etypes + 7))},"),
            ("                                      for r in range(num_etypes)}, aggregate)",
             "                                      for r in range(7, num_etypes + 7)}, "
             "aggregate)"),
            ("        types = ntype if", "        etype = etype + 7\n        types = ntype if")]:
        assert old in text
        text = text.replace(old, new)
    model = tmp_path / "shared_merged.py"
    model.write_text(text)
    parts, options = _typed(typed_parts, "--exec", "sar")
    plan, _ = _compiled(tmp_path, model, parts, *options)
    assert len(plan["layers"]) == 20 and {lp["exec_mode"] for lp in plan["layers"]} == {"sar"}
    counted, run = _counted(tmp_path, model, parts, "--epochs", "2", *options)
    assert all(c > 0 for c in counted)
    assert [w["planned_step_bytes_sent"] for w in run["per_worker"]] == counted
    assert _predicted(plan) == counted


def test_a_step_over_the_budget_is_said_as_compile_says(tmp_path, cora_parts):
    """A budget below what the layers keep of their own shards: compile says so, and the
    workers' report says it too (it said nothing), with the bytes compile planned."""
    plan, _ = _compiled(tmp_path, ROOT / "models" / "gcn.py", cora_parts, "--mem-budget", "100K")
    kept = [sum(lp["bytes_kept_per_worker"][r] for lp in plan["layers"]) for r in range(2)]
    assert min(kept) > 100 * 1024
    out = tmp_path / "train.json"
    proc = run_or_show_stacks([sys.executable, "-m", "sarc.cli", "train", "models/gcn.py",
                               "--partition", str(cora_parts), "--epochs", "1",
                               "--mem-budget", "100K", "--json", str(out)], cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads(out.read_text())
    assert [w["planned_step_bytes_kept"] for w in run["per_worker"]] == kept
    assert all(w["over_budget"] for w in run["per_worker"])
    assert "over the budget 100.0 KiB on workers [0, 1]: a step keeps" in proc.stdout


OWN_EDGE_TYPES = "import torch\n" + MEAN + """

class Net(nn.Module):
    def __init__(self, i, c):
        super().__init__()
        self.conv = sarc.HeteroConv({0: Mean(i, c), 1: Mean(i, c)})

    def forward(self, g, x):
        return self.conv(g, x, etype=torch.arange(g.num_edges, device=x.device) % 2)


HPARAMS = {"dataset": "cora", "self_loops": True}


def build_model(in_feats, num_classes, **_):
    return Net(in_feats, num_classes)
"""


def test_relations_of_edge_types_compile_cannot_place_are_said(tmp_path, cora_parts, capsys):
    """Edge types a model makes of a graph with self loops, which the partition's edges do
    not carry (a loop has no original edge): its relations are planned on the whole
    shards, and compile says so."""
    model = tmp_path / "own_types.py"
    model.write_text(OWN_EDGE_TYPES)
    plan, _ = _compiled(tmp_path, model, cora_parts, "--exec", "sar")
    assert {lp["exec_mode"] for lp in plan["layers"]} == {"sar"}
    assert ("2 relation layer call(s) (conv.layers.0, ...) were given edge types that are not "
            "one per edge of the partitioned graph: planned on the whole shards' statistics"
            in capsys.readouterr().out)


@pytest.mark.parametrize("self_loops", [True, False])
def test_sampling_plans_the_graph_train_samples(tmp_path, cora_parts, self_loops):
    """GAT adds a self loop to every node of every shard before sampling; compile samples
    the shards so, and the first epoch's steps, as train does."""
    options = ("--set", f"self_loops={self_loops}", "--mode", "sampling", "--fanouts", "3,3",
               "--batch-size", "32", "--exec", "oneshot")
    model = ROOT / "models" / "gat.py"
    plan, _ = _compiled(tmp_path, model, cora_parts, *options)
    counted, _ = _counted(tmp_path, model, cora_parts, *options)
    assert len(plan["layers"][0]["batches"]["bytes_sent_per_step"]["per_batch"]) == 5  # 140 / 32
    assert _predicted(plan) == counted


def test_full_mode_plans_the_shards_with_their_self_loops(tmp_path, cora_parts):
    """Per-edge figures of a full-batch plan count the self loops train adds."""
    model = ROOT / "models" / "gcn.py"
    on, _ = _compiled(tmp_path, model, cora_parts)
    off, _ = _compiled(tmp_path / "off", model, cora_parts, "--set", "self_loops=False")
    data = load_dataset("cora")
    loops = int((data.edge_src == data.edge_dst).sum())
    assert sum(off["stats"]["edges"]) == data.num_edges
    assert sum(on["stats"]["edges"]) == data.num_edges - loops + data.num_nodes


def test_a_partition_of_another_graph_is_refused(tmp_path, capsys):
    """The partition holds a 50-feature, 3-class graph; the model's dataset is Cora: a plan
    of Cora's model would not be what the workers (built from the partition) run."""
    gen = np.random.default_rng(0)
    n = 60
    graph = tmp_path / "synth.npz"
    np.savez(graph, edge_src=gen.integers(0, n, 300), edge_dst=gen.integers(0, n, 300),
             num_nodes=np.int64(n), feat=gen.random((n, 50)).astype(np.float32),
             label=gen.integers(0, 3, n), train_mask=np.arange(n) < 20,
             val_mask=(np.arange(n) >= 20) & (np.arange(n) < 40), test_mask=np.arange(n) >= 40,
             num_classes=np.int64(3))
    parts = tmp_path / "parts"
    assert main(["partition", "--graph", str(graph), "--parts", "2", "--out", str(parts)]) == 0
    capsys.readouterr()
    out = tmp_path / "out"
    gcn = str(ROOT / "models" / "gcn.py")
    assert main(["compile", gcn, "--partition", str(parts), "--out", str(out)]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cora" in err and "--dataset" in err, err
    assert not out.exists()
    # the graph partitioned, named: planned as the workers run it
    assert main(["compile", gcn, "--partition", str(parts), "--dataset", str(graph),
                 "--emit", "plan", "--out", str(out)]) == 0
    assert json.loads((out / "plan.json").read_text())["layers"][1]["exchange"]["width"] == 3
    # another dataset given for it is refused as sarc train refuses it
    assert main(["compile", gcn, "--partition", str(parts), "--dataset", "cora",
                 "--out", str(tmp_path / "o2")]) != 0
    assert "not the graph partitioned" in capsys.readouterr().err


@pytest.mark.parametrize("argv,needle", [
    (("--mode", "sampling", "--fanouts", "10"), "1 fanout (10)"),
    (("--emit", ","), "--emit"),
])
def test_options_train_refuses_are_refused_without_a_partition(tmp_path, capsys, argv, needle):
    out = tmp_path / "out"
    assert main(["compile", str(ROOT / "models" / "gcn.py"), *argv, "--out", str(out)]) != 0
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()
