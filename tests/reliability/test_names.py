"""Names from the user's code reach generated code only as literals, and file names only
sanitized: a hostile name runs nothing, writes nothing outside its folder, and the layer
either works (equal to a plainly named twin) or is refused with a clear error.

Each payload, pasted into generated code as code, would create the file ``marker`` (the
tests check it is absent); pasted into a file name, it would write outside ``--out`` or
the module cache (the tests check nothing appears there).
"""
from __future__ import annotations

import ast
import os
import stat
from pathlib import Path

import pytest
import torch
from torch import nn

import sarc
from sarc import names
from sarc.backends import codegen
from sarc.errors import SarcError

from difftest import BACKENDS

from .catalogue import case
from .harness import assert_error, run_sarc

pytestmark = pytest.mark.once   # end to end, DGL-free: the main environment's run (Makefile)

WIDTH = 4


def marker_of(tmp_path: Path) -> Path:
    m = tmp_path / "marker"
    assert "." not in str(m) and '"' not in str(m), m  # the payloads below spell the path out
    return m


def make_layer(cls: str = "Plain", feat: str = "h", param: str = "W", out: str = "h",
               msg: str = "m"):
    """A linear message + sum layer whose class, feature, parameter, message and output
    have the names given."""
    def __init__(self):
        sarc.Layer.__init__(self, node={feat: WIDTH})
        self.register_parameter(param, nn.Parameter(torch.randn(WIDTH, WIDTH)))

    def message(self, src, dst, edge):
        return {msg: torch.nn.functional.linear(getattr(src, feat), getattr(self, param))}

    def reduce(self, bundle):
        return sarc.sum(getattr(bundle, msg))

    def update(self, dst, agg):
        return {out: agg.agg}

    return type(cls, (sarc.Layer,), {"__init__": __init__, "message": message,
                                     "reduce": reduce, "update": update})


def run_against_plain(layer_cls) -> None:
    """``layer_cls`` computes what the plainly named layer computes."""
    g = sarc.Graph.from_edges(torch.tensor([0, 1, 2, 3, 0]), torch.tensor([1, 2, 3, 0, 2]), 4)
    x = torch.randn(4, WIDTH)
    hostile, plain = layer_cls(), make_layer()()
    (p,), (q,) = hostile.parameters(), plain.parameters()
    with torch.no_grad():
        q.copy_(p)
    got, want = hostile(g, x), plain(g, x)
    got = next(iter(got.values())) if isinstance(got, dict) else got
    torch.testing.assert_close(got, want)


def code_payload(marker: Path) -> str:
    """An expression statement that creates ``marker``."""
    return f'open("{marker}", "w")'


@case("names", "a feature name with a quote that closes the generated string", "literal")
def test_feature_name_with_a_quote(tmp_path):
    marker = marker_of(tmp_path)
    feat = f'h"] if {code_payload(marker)} else inputs["h'
    run_against_plain(make_layer(cls="QuoteFeature", feat=feat))
    assert not marker.exists()


@case("names", "a feature named as sarc names its own values (`$x0`, `$agg0`, `grad:h`, "
      "`param:W`)", "error-at-line")
@pytest.mark.parametrize("feat", ["$x0", "$agg0", "$d1", "grad:h", "param:W", "norm:h"])
def test_a_feature_named_as_sarcs_own_values_is_refused(feat):
    """The distributed split's values ($x0, $d0, $agg0) and the backward's leaves (grad:h,
    param:W) share the inputs' names: a feature of one of those names was taken for it (on 2
    workers a silently other loss, or a KeyError)."""
    with pytest.raises(sarc.DSLError, match=r"node feature '[^']+': names that start with "
                       r"'\$' or hold ':' are sarc's own") as info:
        make_layer(feat=feat)()
    assert info.value.loc is not None and info.value.loc.file == __file__


@case("names", "a layer class name with a newline and code after it", "literal")
def test_class_name_with_a_newline(tmp_path):
    marker = marker_of(tmp_path)
    cls = f"Evil\n{code_payload(marker)}\n#"
    run_against_plain(make_layer(cls=cls))
    assert not marker.exists()


@case("names", "a parameter name with a quote that closes the generated string", "literal")
def test_parameter_name_with_a_quote(tmp_path):
    marker = marker_of(tmp_path)
    param = f'W"] if {code_payload(marker)} else params["W'
    assert "." not in param  # torch refuses dots in parameter names
    run_against_plain(make_layer(cls="QuoteParam", param=param))
    assert not marker.exists()


@case("names", "a key of the dict update returns that closes the generated dict", "literal")
def test_update_dict_key(tmp_path):
    marker = marker_of(tmp_path)
    key = f'h": {code_payload(marker)} and None, "z'
    layer = make_layer(cls="QuoteOutput", out=key)
    run_against_plain(layer)
    assert [k for k, _ in layer().trace().outputs] == [key]
    assert not marker.exists()


@case("names", "a key of the dict message returns that would close the generated dict",
      "error")
def test_message_dict_key(tmp_path):
    marker = marker_of(tmp_path)
    layer = make_layer(cls="QuoteMessage", msg=f'm": {code_payload(marker)}, "z')()
    g = sarc.Graph.from_edges(torch.tensor([0]), torch.tensor([1]), 2)
    with pytest.raises(SarcError, match="read in reduce as msg.<key>, so each must be a str "
                                        "that is a Python identifier"):
        layer(g, torch.randn(2, WIDTH))
    assert not marker.exists()


@case("names", "a feature name with a newline, in a distributed schedule's header", "literal")
def test_feature_name_in_the_schedule_header(tmp_path):
    marker = marker_of(tmp_path)
    feat = f"h\n{code_payload(marker)}\n#"
    model = tmp_path / "model_file"
    model.mkdir()
    path = model / "newline_feature.py"
    path.write_text(MODEL_FILE.format(cls="Layer0", feat=feat, sub="conv"))
    out = tmp_path / "out"
    proc = run_sarc("compile", path, "--workers", "2", "--emit", "schedule,kernels",
                    "--out", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (out / "conv.schedule.py").read_text()
    ast.parse(text)
    exec(compile(text, "conv.schedule.py", "exec"), {})  # its imports and definitions only
    assert not marker.exists()


@case("names", "a submodule named `/tmp/...` (an absolute path) in `sarc compile --out`",
      "literal")
def test_submodule_named_an_absolute_path(tmp_path):
    escaped = tmp_path / "escaped"
    path = tmp_path / "abs_submodule.py"
    path.write_text(MODEL_FILE.format(cls="Layer0", feat="h", sub=str(escaped)))
    out = tmp_path / "out"
    proc = run_sarc("compile", path, "--emit", "ir,kernels,schedule", "--out", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["abs_submodule.py", "out"]
    stem = names.file_stem(str(escaped))
    assert stem.startswith("_tmp_") and "/" not in stem
    assert (out / f"{stem}.ir").is_file() and (out / f"{stem}.torch.py").is_file()



def test_layers_whose_files_would_share_a_name(tmp_path):
    """Layer ``a`` writes its traced IR to ``a.traced.ir``; a layer held by ``a`` as
    ``traced`` (named ``a.traced``) would write its optimized IR there: each layer keeps
    files of its own, whatever is emitted."""
    from sarc.artifacts import compile_model, write_artifacts
    model = nn.Module()
    model.a = make_layer(cls="Outer")()
    model.a.traced = make_layer(cls="Inner")()
    model.b = make_layer(cls="Other")()
    art = compile_model(model, "clash", workers=2)
    for emit in (("ir",), ("ir", "kernels", "schedule")):
        out = tmp_path / "-".join(emit)
        written = write_artifacts(art, out, emit)
        per_layer = 2 * ("ir" in emit) + ("kernels" in emit) + ("schedule" in emit)
        assert len(set(written)) == len(written) == 3 * per_layer + ("schedule" in emit)
        assert sorted(p.name for p in out.iterdir()) == sorted(
            [p.name for p in written] + ["sarc-set.json"])
        ir = {p.name: p.read_text() for p in written if p.name.endswith(".ir")}
        assert "b.ir" in ir and "b.traced.ir" in ir  # no clash: b's names are unchanged
        a_names = sorted(n for n in ir if n.startswith("a"))
        assert a_names == sorted([f"{names.file_stem('a', digest=True)}.ir",
                                  f"{names.file_stem('a', digest=True)}.traced.ir",
                                  f"{names.file_stem('a.traced', digest=True)}.ir",
                                  f"{names.file_stem('a.traced', digest=True)}.traced.ir"])
        assert all(("Inner" in ir[n]) == ("traced-" in n) for n in a_names), a_names


def test_names_with_terminal_escapes_are_printed_escaped(tmp_path):
    """A submodule and a class named with terminal escapes and a newline: what ``sarc
    compile`` prints, ``plan.txt`` and ``schedule.txt`` show them escaped, on their line."""
    sub, cls = "conv\x1b[2J\x1b[31mFAKE\nwrote 0 files", "Evil\x1b]0;title\x07\u202e"
    path = tmp_path / "escapes.py"
    path.write_text(MODEL_FILE.format(cls=cls, feat="h", sub=sub))
    out = tmp_path / "out"
    proc = run_sarc("compile", path, "--workers", "2", "--emit", "plan,schedule", "--out", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for where, text in (("stdout", proc.stdout), ("plan.txt", (out / "plan.txt").read_text()),
                        ("schedule.txt", (out / "schedule.txt").read_text())):
        assert all(line.isprintable() for line in text.splitlines()), where
        assert not any(line.startswith("wrote 0 files") for line in text.splitlines()), where
        assert "conv\\x1b[2J\\x1b[31mFAKE\\nwrote 0 files" in text, where
    assert "Evil\\x1b]0;title\\x07\\u202e" in proc.stdout
    proc = run_sarc("compile", tmp_path / "no\x1b[31mpe.py")  # an error naming the name
    assert_error(proc, "no\\x1b[31mpe.py")
    assert all(line.isprintable() for line in proc.stderr.splitlines())

def test_debug_output_shows_names_escaped(monkeypatch, capsys):
    """``SARC_DEBUG=1`` (each compiled kernel) and ``=2`` (the IR after each pass) printed
    a layer class's name raw: a newline and a bidirectional override reached the terminal."""
    layer_cls = make_layer(cls="Evil\nsarc: all checks passed\u202e")
    g = sarc.Graph.from_edges(torch.tensor([0]), torch.tensor([1]), 2)
    for level in ("1", "2"):
        monkeypatch.setenv("SARC_DEBUG", level)
        layer_cls()(g, torch.randn(2, WIDTH))
        out = capsys.readouterr().out
        assert "Evil\\nsarc: all checks passed\\u202e" in out, out
        assert all(line.isprintable() for line in out.splitlines()), out
        assert not any(line.startswith("sarc: all checks") for line in out.splitlines())


@case("names", "a layer class named `../../x` (its generated module's file name)", "literal")
def test_class_name_that_climbs_out_of_the_cache(tmp_path, monkeypatch):
    cache = tmp_path / "a" / "b" / "cache"
    monkeypatch.setenv("SARC_CACHE_DIR", str(cache))
    run_against_plain(make_layer(cls="../../escaped"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["b"]
    written = [p.name for p in cache.iterdir() if p.suffix == ".py"]
    assert any("_escaped_torch_" in n for n in written), written


@case("names", "a class name with `\"\"\"` and a newline, in a Triton kernel's docstring",
      "literal")
def test_class_name_in_a_triton_docstring(tmp_path):
    pytest.importorskip("triton")
    marker = marker_of(tmp_path)
    cls = f'T"""\n{code_payload(marker)}\n"""'
    path = tmp_path / "triton_model.py"
    path.write_text(MODEL_FILE.format(cls=cls, feat="h", sub="conv"))
    out = tmp_path / "out"
    proc = run_sarc("compile", path, "--backend", "triton", "--emit", "kernels", "--out", out,
                    env={"TRITON_INTERPRET": "1"})
    if "needs triton" in proc.stderr:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode == 0, proc.stderr[-3000:]
    kernels = list((out / "conv.kernels").iterdir())
    assert kernels
    for k in kernels:
        text = k.read_text()
        assert names.literal(cls) in text.split("\n", 1)[0]  # shown as a literal
        docstring, *code = ast.parse(text).body
        assert docstring.value.value.startswith(f'Generated by sarc: layer "{cls}" (')
        assert not [s for s in code if isinstance(s, ast.Expr)]  # no statement of the name's
    assert not marker.exists()


@case("names", "a model file whose name holds a newline and code", "literal")
def test_model_file_name_with_a_newline(tmp_path):
    path = tmp_path / 'm\nopen("marker", "w")\n#.py'
    path.write_text(MODEL_FILE.format(cls="Layer0", feat="h", sub="conv"))
    out = tmp_path / "out"
    proc = run_sarc("compile", path, "--emit", "kernels", "--out", out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "\nopen(" not in (out / "conv.torch.py").read_text()
    assert not (tmp_path / "marker").exists()


@case("names", "a model file whose name holds a terminal escape and a line break, trained",
      "literal")
def test_a_model_files_name_is_printed_escaped_by_sarc_train(tmp_path):
    """sarc train's header line and its --quiet summary name the model by its file's name;
    it reached the terminal raw (a fake line, a cleared screen)."""
    root = Path(__file__).resolve().parents[2]
    path = tmp_path / "x\x1b[2J\nsarc train: all good.py"
    path.write_text((root / "models" / "gcn.py").read_text())
    for quiet in ((), ("--quiet",)):
        proc = run_sarc("train", path, "--epochs", "1", *quiet, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = proc.stdout + proc.stderr
        assert "\x1b" not in out and "\nsarc train: all good" not in out, out
        assert "x\\x1b[2J\\nsarc train: all good" in out, out


@case("names", "paths holding a terminal escape and a line break: sarc partition's --graph and "
      "--out, sarc compile's --out, sarc train --quiet's dataset file", "literal")
def test_paths_the_commands_print_are_escaped(tmp_path):
    """Each command's summary lines printed them raw."""
    import numpy as np
    root = Path(__file__).resolve().parents[2]
    evil = "x\x1b[2J\nfake"
    arrays = dict(np.load(root / "sarc" / "data" / "cora.npz", allow_pickle=False))
    graph = tmp_path / f"{evil}.npz"
    np.savez(graph, **{k: arrays[k] for k in ("edge_src", "edge_dst", "num_nodes")})
    data = tmp_path / f"{evil}-data.npz"
    np.savez(data, **arrays)
    runs = [run_sarc("partition", "--graph", graph, "--parts", "2", "--method", "random",
                     "--out", tmp_path / f"{evil}-parts", cwd=tmp_path),
            run_sarc("compile", root / "models" / "gcn.py", "--emit", "plan", "--out",
                     tmp_path / f"{evil}-out", cwd=tmp_path),
            run_sarc("train", root / "models" / "gcn.py", "--dataset", data, "--epochs", "1",
                     "--quiet", cwd=tmp_path)]
    for proc in runs:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "\x1b" not in proc.stdout and "\nfake" not in proc.stdout, proc.stdout
        assert "x\\x1b[2J\\nfake" in proc.stdout, proc.stdout


@case("names", "a layer output named with a non-string key", "error")
def test_non_string_output_key(tmp_path):
    layer = make_layer(cls="IntKey", out=7)()
    g = sarc.Graph.from_edges(torch.tensor([0]), torch.tensor([1]), 2)
    with pytest.raises(SarcError, match="the key 7: .* must be a non-empty str"):
        layer(g, torch.randn(2, WIDTH))


@case("names", "an infinite or NaN constant (`clamp_min(float('-inf'))`) in generated code",
      "exact")
def test_infinite_constants_are_python_literals():
    class Inf(sarc.Layer):
        def __init__(self):
            super().__init__(node={"h": WIDTH})

        def message(self, src, dst, edge):
            return src.h.clamp_min(float("-inf")) * float("inf") + float("-inf")

        def reduce(self, msg):
            return sarc.max(msg.m)

    g = sarc.Graph.from_edges(torch.tensor([0, 1]), torch.tensor([1, 0]), 2)
    x = torch.randn(2, WIDTH)
    want = (x * float("inf") - float("inf"))[[1, 0]]  # inf - inf is nan where x > 0
    torch.testing.assert_close(Inf()(g, x), want, equal_nan=True)


# --- the module cache ---------------------------------------------------------------------

@case("names", "a module cache dir writable by group and others", "error")
def test_world_writable_cache_is_refused(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o777)
    model = tmp_path / "m.py"
    model.write_text(MODEL_FILE.format(cls="Layer0", feat="h", sub="conv"))
    proc = run_sarc("compile", model, "--emit", "kernels", env={"SARC_CACHE_DIR": str(cache)})
    assert_error(proc, str(cache), "writable by group or others", "chmod 700")
    assert list(cache.iterdir()) == []


@case("names", "a module cache dir owned by another user (planted bytecode)", "error")
def test_cache_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    planted = cache / "planted.py"
    planted.write_text("raise SystemExit('planted code ran')\n")
    other = os.getuid() + 4242
    os.chown(cache, other, -1)
    monkeypatch.setenv("SARC_CACHE_DIR", str(cache))
    with pytest.raises(SarcError, match=f"owned by uid {other}") as e:
        codegen.cache_dir()
    assert str(cache) in str(e.value)


@case("names", "a private module cache that cannot be written (/proc/self: a read-only "
      "directory of one's own)", "error")
@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_cache_that_cannot_be_written_is_an_error(tmp_path, monkeypatch):
    """It passed the privacy checks, and the first module written there was a traceback
    (tempfile's PermissionError), in sarc train and sarc compile."""
    import shutil

    from sarc.native.kernels import _build
    monkeypatch.setenv("SARC_CACHE_DIR", "/proc/self")
    with pytest.raises(SarcError, match="the module cache cannot be written .*/proc/self/"
                                        ".*SARC_CACHE_DIR"):
        codegen.load_module("Layer0_torch_0", "x = 1\n")
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler:   # the CPU kernels are built into the cache too
        with pytest.raises(SarcError, match="the module cache cannot be written"):
            _build(compiler)
    models = Path(__file__).resolve().parents[2] / "models"
    proc = run_sarc("compile", models / "gcn.py", "--emit", "plan", "--out",
                    tmp_path / "out", env={**os.environ, "SARC_CACHE_DIR": "/proc/self"})
    assert_error(proc, "the module cache cannot be written")


@case("names", "a module cache inside a folder everyone may write to (no sticky bit)", "error")
def test_cache_inside_a_world_writable_folder_is_refused(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("SARC_CACHE_DIR", str(shared / "mine" / "cache"))
    with pytest.raises(SarcError, match=f"inside {shared}, which every user may write to"):
        codegen.cache_dir()
    shared.chmod(0o1777)  # as /tmp: others cannot rename what is ours
    assert codegen.cache_dir() == shared / "mine" / "cache"
    assert stat.S_IMODE((shared / "mine").stat().st_mode) == 0o700


@case("names", "a module cache that cannot be created (a file in its path)", "error")
def test_a_cache_that_cannot_be_created_is_an_error(tmp_path):
    """It was a FileNotFoundError traceback from the cache's mkdir."""
    (tmp_path / "file").write_text("not a folder\n")
    cache = tmp_path / "file" / "cache"
    model = tmp_path / "m.py"
    model.write_text(MODEL_FILE.format(cls="Layer0", feat="h", sub="conv"))
    proc = run_sarc("compile", model, "--emit", "kernels", env={"SARC_CACHE_DIR": str(cache)})
    assert_error(proc, f"the module cache {cache} cannot be created", "SARC_CACHE_DIR")


@case("names", "the default module cache: created 0700 under $XDG_CACHE_HOME", "exact")
def test_default_cache_is_private(tmp_path, monkeypatch):
    monkeypatch.delenv("SARC_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    root = codegen.cache_dir()
    assert root.is_relative_to(tmp_path / "xdg" / "sarc")
    level = root
    while level != tmp_path:
        assert stat.S_IMODE(level.stat().st_mode) == 0o700, level
        level = level.parent
    run_against_plain(make_layer(cls="InDefaultCache"))
    assert any(p.name.startswith("InDefaultCache_torch_") for p in root.iterdir())


# --- the name functions themselves ---------------------------------------------------------

HOSTILE = ['h"', "h'", 'a"""b', "a\\", "\n", "\r", "a\x00b", "\u2028", "\x1b[31m", "é", "",
           "../../x", "/tmp/x", ".hidden", "..", "a b", "x" * 300]


@pytest.mark.parametrize("name", HOSTILE, ids=range(len(HOSTILE)))
def test_literal_round_trips_and_stays_on_one_line(name):
    lit = names.literal(name)
    assert ast.literal_eval(lit) == name
    assert "\n" not in lit and "\r" not in lit and lit.isprintable()
    comment = f"# layer {names.shown(name)}\nx = 1\n"
    assert [type(s) for s in ast.parse(comment).body] == [ast.Assign]
    doc = f'"""layer {names.shown(name)} (file)"""\n'
    assert [type(s) for s in ast.parse(doc).body] == [ast.Expr]


@pytest.mark.parametrize("name", HOSTILE, ids=range(len(HOSTILE)))
def test_file_stem_stays_in_its_folder(name, tmp_path):
    stem = names.file_stem(name)
    assert stem and not stem.startswith(".") and len(stem) < 120
    assert all(c.isascii() and (c.isalnum() or c in "_.-") for c in stem)
    assert names.inside(tmp_path, stem + ".py").parent == tmp_path
    assert names.file_stem("conv1") == "conv1" and names.file_stem("convs.0") == "convs.0"


def test_inside_refuses_a_path_that_leaves(tmp_path):
    for bad in ("../x", "/etc/passwd", "a/../../x", ""):
        with pytest.raises(SarcError, match="would leave"):
            names.inside(tmp_path, bad)


MODEL_FILE = '''\
import torch
from torch import nn
import sarc

FEAT = {feat!r}


class Layer(sarc.Layer):
    def __init__(self, d_in, d_out):
        super().__init__(node={{FEAT: d_in}})
        self.lin = nn.Linear(d_in, d_out)

    def message(self, src, dst, edge):
        return self.lin(getattr(src, FEAT))

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, dst, agg):
        return agg.agg


Layer = type({cls!r}, (Layer,), {{}})


class Model(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.add_module({sub!r}, Layer(d_in, d_out))

    def forward(self, g, x):
        return self.get_submodule({sub!r})(g, x)


def build_model(in_feats, num_classes, **_):
    return Model(in_feats, num_classes)
'''


@case("names", "a dataset file whose `name` array holds a line break and a terminal escape",
      "literal")
def test_a_datasets_name_is_read_escaped(tmp_path):
    """The name is printed in sarc train's header line and recorded in reports; it reached
    the terminal raw."""
    import numpy as np
    from sarc.datasets import load_dataset
    root = Path(__file__).resolve().parents[2]
    arrays = dict(np.load(root / "sarc" / "data" / "cora.npz", allow_pickle=False))
    arrays["name"] = np.array("cora\x1b[2J\nfake line")
    np.savez(tmp_path / "named.npz", **arrays)
    name = load_dataset(str(tmp_path / "named.npz")).name
    assert name == "cora\\x1b[2J\\nfake line" and name.isprintable(), name


class DunderFeature(sarc.Layer):
    def __init__(self):
        super().__init__(node={"__x": 3})

    def message(self, src, dst, edge):
        return src["__x"] * 2.0

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("names", "a feature named `__x`, read as `src[\"__x\"]`", "exact")
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_feature_named_with_two_underscores_is_read_by_subscript(backend):
    """It was a bare AttributeError: __x."""
    g = sarc.Graph.from_edges(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]), 3)
    x = torch.randn(3, 3)
    out = DunderFeature().set_backend(backend)(g, **{"__x": x})
    assert torch.allclose(out, 2.0 * x[[2, 0, 1]])


@case("names", "a model file whose path holds a byte that is not UTF-8", "literal")
def test_a_model_path_of_bytes_not_utf8(tmp_path):
    """Its module's name hashed the path's text, which cannot be encoded (a traceback)."""
    folder = tmp_path / os.fsdecode(b"dir\xff")
    folder.mkdir()
    model = folder / "gcn.py"
    model.write_bytes((Path(__file__).resolve().parents[2] / "models" / "gcn.py").read_bytes())
    proc = run_sarc("compile", model, "--emit", "plan", "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "out" / "plan.txt").is_file()


@case("names", "a layer class named `GCNLayé` under a locale that cannot encode it "
      "(`LC_ALL=C`)", "literal")
def test_a_name_the_locale_cannot_encode(tmp_path):
    """The generated modules and the set's files were written in the locale's encoding (a
    traceback), and the summary printed so."""
    source = (Path(__file__).resolve().parents[2] / "models" / "gcn.py").read_text()
    assert "class GCNLayer" in source
    model = tmp_path / "m.py"
    model.write_text(source.replace("GCNLayer", "GCNLay\u00e9"), encoding="utf-8")
    proc = run_sarc("compile", model, "--emit", "ir,kernels", "--out", tmp_path / "out",
                    env={"LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0",
                         "SARC_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "GCNLay\\xe9" in proc.stdout   # escaped where the locale cannot say it
    assert "GCNLay\u00e9" in (tmp_path / "out" / "conv1.torch.py").read_text(encoding="utf-8")
