"""The Triton backend's kernels compiled for a GPU on a machine without one.

Triton compiles a kernel ahead of time for a target it is told (``GPUTarget("cuda", 90,
32)``: an H100 / H200) down to PTX and, through the ptxas its wheel ships, a cubin: no
driver or device is asked. Launches are recorded while a layer runs in the interpreter
(``record``), each with its arguments' types and its compile-time constants; ``compile_all``
then imports each kernel's module again as compiled code (``TRITON_INTERPRET`` off) and
compiles it for the target once per signature and per config of its autotune space that
the GPU's autotuner would try (the pruned ``CONFIGS``). What the interpreter accepts and
the GPU compiler refuses (a type its code generator lacks, a float64 ``tl.dot``, a block
shape it cannot lay out) fails here, as it would on the first launch on a GPU.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from sarc.backends import triton_runtime

TARGETS = (("cuda", 90, 32),)
"""(backend, compute capability, warp size): the GPUs compiled for."""

_TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
          torch.float64: "fp64", torch.int64: "i64", torch.int32: "i32", torch.int16: "i16",
          torch.int8: "i8", torch.uint8: "u8", torch.bool: "i1"}


@dataclass
class Launch:
    """One recorded launch: the kernel's module file, its signature and constants."""

    path: str
    signature: tuple[tuple[str, str], ...]
    constants: tuple[tuple[str, object], ...]
    configs: tuple


@dataclass
class Recorder:
    launches: dict = field(default_factory=dict)   # (path, signature, constants) -> Launch

    def add(self, kernel, configs, args, constexprs) -> None:
        fn = kernel.fn
        names = list(fn.__code__.co_varnames[:fn.__code__.co_argcount])
        sig, consts = [], dict(constexprs)
        for name, a in zip(names, args):
            if isinstance(a, torch.Tensor):
                sig.append((name, "*" + _TYPES[a.dtype]))
            elif isinstance(a, bool) or a is None:
                consts[name] = a
            elif isinstance(a, int):
                sig.append((name, "i64" if not -2**31 <= a < 2**31 else "i32"))
            elif isinstance(a, float):
                sig.append((name, "fp32"))
            else:
                raise TypeError(f"{name}: a launch argument of type {type(a).__name__}")
        named = dict(zip(names, args))
        kept = triton_runtime._prune(list(configs), named) if len(configs) > 1 else list(configs)
        path = fn.__code__.co_filename
        key = (path, tuple(sig), tuple(sorted(consts.items())))
        if key not in self.launches:
            self.launches[key] = Launch(path, tuple(sig), key[2], tuple(kept))
        else:
            old = self.launches[key]
            merged = {id(c): c for c in (*old.configs, *kept)}
            old.configs = tuple(merged.values())


@contextlib.contextmanager
def record():
    """Record every kernel launch of the Triton runtime while the block runs."""
    rec = Recorder()
    real = triton_runtime.run

    def spy(kernel, configs, key, grid, args, constexprs, *, max_deg, d):
        rec.add(kernel, configs, args, constexprs)
        return real(kernel, configs, key, grid, args, constexprs, max_deg=max_deg, d=d)

    triton_runtime.run = spy
    try:
        yield rec
    finally:
        triton_runtime.run = real


def jobs(rec: Recorder) -> list[dict]:
    """The recorded launches as ``compile_all`` takes them (plain data: a worker process
    records, the test compiles)."""
    return [{"path": l.path, "signature": list(l.signature), "constants": list(l.constants),
             "configs": [[c.kwargs, c.num_warps, c.num_stages] for c in l.configs]}
            for l in rec.launches.values()]


def compile_all(rec: Recorder | list[dict], timeout: float = 1800) -> list[str]:
    """Compile every recorded launch (a ``Recorder`` or its ``jobs``) for ``TARGETS``, once
    per config, in a new process (the interpreter leaves ``triton.language`` patched in this
    one); the failures, each as 'module: config: error'."""
    jobs_ = rec if isinstance(rec, list) else jobs(rec)
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "launches.json"
        spec.write_text(json.dumps(jobs_))
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
        proc = subprocess.run([sys.executable, __file__, str(spec)], capture_output=True,
                              text=True, env=env, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"the compile process failed ({proc.returncode}):\n"
                               f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return json.loads((Path(tmp) / "failures.json").read_text())


def _compile_jobs(spec: Path) -> list[str]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    failures = []
    for n, job in enumerate(json.loads(spec.read_text())):
        name = f"sarc_gpu_compile_{n}"
        mod_spec = importlib.util.spec_from_file_location(name, job["path"])
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[name] = module
        mod_spec.loader.exec_module(module)
        kernel = module.kernel
        for meta, warps, stages in job["configs"]:
            consts = {**dict(job["constants"]), **meta}
            sig = {**dict(job["signature"]), **{k: "constexpr" for k in consts}}
            sig = {k: sig[k] for k in kernel.arg_names}
            src = ASTSource(fn=kernel, signature=sig, constexprs=consts)
            for target in TARGETS:
                try:
                    triton.compile(src, target=GPUTarget(*target),
                                   options={"num_warps": warps, "num_stages": stages})
                except Exception as e:  # noqa: BLE001 - every failure is reported
                    lines = str(e).strip().splitlines()
                    failures.append(f"{os.path.basename(job['path'])}: {meta}, {warps} warps, "
                                    f"{target}: {type(e).__name__}: {' | '.join(lines[-8:])}")
    return failures


if __name__ == "__main__":
    path = Path(sys.argv[1])
    (path.parent / "failures.json").write_text(json.dumps(_compile_jobs(path)))
