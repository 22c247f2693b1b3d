"""The CPU kernels (``kernels.c``): a CSR SpMM with per-head weights, an SDDMM, the
softmax's backward over an SDDMM, a distributed softmax's partial sums and its score
gradients from its row statistics, a max / min over CSR rows with its tie counts and
its gradient, the transpose of an edge index, and neighbour sampling's per-node draws,
in C, built on first use with the system's C compiler.

The torch backend's products over a graph are these kernels (``torch_ops.spmm``, the
GAT attention's weighted sums and their gradients). torch's own CSR products
(``torch.sparse.mm``, ``sampled_addmm``) are 2x slower on a power-law graph, take one
head at a time, and refuse repeated (row, column) entries; DGL's C++ kernels set the
bar. Built with ``-O3 -march=native`` into sarc's private cache (``cache.cache_dir``),
named by a digest of the source, the compiler and the CPU, written atomically; loaded
with ctypes, which releases the GIL for the call. Where no compiler works, or with
``SARC_CPU_KERNELS=0``, ``kernels()`` is None and the torch backend uses torch's
products (the same sums, in another order of additions), its argsort and the sampler's
bucketed top-k (the same samples).
"""
from __future__ import annotations

import ctypes
import hashlib
import math
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from .cache import cache_dir, cannot_write_cache

SOURCE = Path(__file__).with_name("kernels.c")
FLAGS = ("-O3", "-shared", "-fPIC", "-pthread")
NATIVE = "-march=native"
"""Tried first; a compiler that does not know it builds without."""
DTYPES = (torch.float32, torch.float64)
SHARED_WORK = 1 << 22
"""Multiply-adds from which a product runs on torch's intra-op threads."""
SCATTER_COLS = 32
"""The columns a thread of ``scatter_rows`` takes at a time (``kernels.c``'s own)."""

_lock = threading.Lock()
_loaded: dict[str | None, "Kernels | None"] = {}
"""The kernels built with each ``$CC`` (None: unset, the ``cc`` on the PATH)."""


class Kernels:
    """The loaded library's entry points, on torch tensors."""

    def __init__(self, lib: ctypes.CDLL, path: Path):
        self.path = path
        args = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                ctypes.c_int64, ctypes.c_int, ctypes.c_int]
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        self._spmm, self._sddmm = lib.sarc_spmm, lib.sarc_sddmm
        self._softmax_vjp = lib.sarc_softmax_vjp
        self._spmm.argtypes = args[:4] + [p] * 4 + [i64] + args[5:]
        self._sddmm.argtypes = args[:4] + [i64] + args[4:]
        self._softmax_vjp.argtypes = args[:4] + [i64] + args[4:9] + [i64] + args[9:]
        self._softmax_shares = lib.sarc_softmax_shares
        self._softmax_shares.argtypes = args[:4] + [i64] + [p] * 7 + [i64] * 3 + args[9:]
        for f in (self._spmm, self._sddmm, self._softmax_vjp, self._softmax_shares):
            f.restype = ctypes.c_int
        self._softmax_partial = lib.sarc_softmax_partial
        self._softmax_partial.argtypes = args[:3] + [p] * 2 + [i64] + [p] * 3 + [i64] * 3 + \
            [ctypes.c_int] * 2
        self._softmax_partial.restype = ctypes.c_int
        self._extremum, self._select_sum = lib.sarc_extremum, lib.sarc_select_sum
        self._extremum.argtypes = args[:3] + [p] * 3 + [i64] * 2 + [ctypes.c_int] * 3
        self._select_sum.argtypes = args[:3] + [p] * 4 + [i64] * 2 + [ctypes.c_int] * 2
        for f in (self._extremum, self._select_sum):
            f.restype = ctypes.c_int
        self._scatter_rows = lib.sarc_scatter_rows
        self._scatter_rows.argtypes = [p, ctypes.c_int, p, p, i64, i64, ctypes.c_int, ctypes.c_int]
        self._scatter_rows.restype = ctypes.c_int
        self._transpose = lib.sarc_transpose
        self._transpose.argtypes, self._transpose.restype = [p, p, i64, p, i64, p, p, p], None
        self._sample = lib.sarc_sample
        self._sample.argtypes = [p, p, p, i64, i64, i64, i64, i64, i64, p, p, p, p, ctypes.c_int]
        self._sample.restype = ctypes.c_int

    def transpose(self, cols: torch.Tensor, rows: torch.Tensor, num_cols: int):
        """(colptr, rows in column order, the entry of each) of entries given by column and
        row in row order: ``torch.argsort(cols, stable=True)`` by counting."""
        cols, rows = cols.to(torch.int64).contiguous(), rows.to(torch.int64).contiguous()
        colptr = torch.empty(num_cols + 1, dtype=torch.int64)  # counted by the kernel
        rows_t, order = torch.empty_like(rows), torch.empty_like(cols)
        scratch = torch.empty(num_cols, dtype=torch.int64)  # held: the kernel writes to it
        self._transpose(cols.data_ptr(), rows.data_ptr(), cols.numel(), colptr.data_ptr(),
                        num_cols, scratch.data_ptr(), rows_t.data_ptr(), order.data_ptr())
        return colptr, rows_t, order

    def sample(self, rowptr: torch.Tensor, rows: torch.Tensor, orig: torch.Tensor, fanout: int,
               key: tuple[int, int, int], tag: int, weight: torch.Tensor | None):
        """Neighbour sampling without replacement (``sarc.sampling.neighbours``): (table
        indices, destination positions) of the kept in-edges of ``rows``."""
        rowptr, rows, orig = (t.to(torch.int64).contiguous() for t in (rowptr, rows, orig))
        deg = rowptr.index_select(0, rows + 1) - rowptr.index_select(0, rows)
        # a fanout at or above every row's degree keeps every edge: the kernel's scratch is
        # the fanout's size, so it gets the largest degree instead (the same draws)
        fanout = min(max(fanout, 0), int(deg.max()) if deg.numel() else 0)
        bound = deg.clamp(max=fanout)
        slot = torch.cumsum(bound, 0) - bound
        out = torch.empty(int(bound.sum()), dtype=torch.int64)
        count = torch.empty_like(bound)
        if weight is not None:
            weight = weight.to(torch.float64).contiguous()
        seed, epoch, layer = key
        self._sample(rowptr.data_ptr(), rows.data_ptr(), orig.data_ptr(), rows.numel(), fanout,
                     seed, epoch, layer, tag, None if weight is None else weight.data_ptr(),
                     slot.data_ptr(), out.data_ptr(), count.data_ptr(),
                     _threads(int(deg.sum() if weight is not None else bound.sum()) * 8))
        pos = torch.repeat_interleave(torch.arange(rows.numel()), count)
        if weight is not None:  # fewer than the bound where weights are 0
            out = out[torch.arange(out.numel()) - slot.repeat_interleave(bound)
                      < count.repeat_interleave(bound)]
        return out, pos

    def spmm(self, ptr: torch.Tensor, cols: torch.Tensor, w: torch.Tensor | None,
             x: torch.Tensor, m: int, w_index: torch.Tensor | None = None,
             row_scale: torch.Tensor | None = None,
             col_scale: torch.Tensor | None = None,
             out: torch.Tensor | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
        """[m, H, D]: row i, head h, ``row_scale[i]`` times the sum over row i's entries e of
        w[k, h] * col_scale[c] * x[c, h] with c = cols[e], k = w_index[e] (None: e); ``w``
        [K, H] or None for 1, the scales [m] and [n] or None for 1, ``x`` [n, H, D]. A
        product over a transposed index reads the weights through ``w_index`` instead of
        a permuted copy of them. Written into ``out`` where given (contiguous, m x H x D
        numbers of the result's dtype, in any shape). ``dtype``: that of the weights, the
        sums and the result (x's where None); float64 over a float32 x reads x as it is."""
        n = x.shape[0]
        x, ldx = _rows(x)
        dtype = dtype or x.dtype
        prec = 2 if (dtype, x.dtype) == (torch.float64, torch.float32) else \
            int(dtype == torch.float64)
        assert prec == 2 or dtype == x.dtype, (dtype, x.dtype)
        scales = [None if s is None else s.to(dtype).contiguous() for s in (row_scale, col_scale)]
        for s, rows in zip(scales, (m, n)):
            assert s is None or s.shape == (rows,), (s.shape, rows)
        _, heads, width = x.shape
        if out is None:
            out = x.new_empty(m, heads, width, dtype=dtype)
        assert out.is_contiguous() and out.dtype == dtype and out.numel() == m * heads * width
        if w is not None:
            w = w.to(dtype).contiguous()
            rows = cols.numel() if w_index is None else w.shape[0]
            assert w.shape == (rows, heads), (w.shape, cols.shape, heads)
        if w_index is not None:
            w_index = w_index.to(torch.int64).contiguous()
            assert w_index.shape == cols.shape, (w_index.shape, cols.shape)
        ptr, cols, wide = _index(ptr, cols)
        self._spmm(ptr.data_ptr(), cols.data_ptr(), wide, None if w is None else w.data_ptr(),
                   None if w_index is None else w_index.data_ptr(),
                   *(None if s is None else s.data_ptr() for s in scales), x.data_ptr(), ldx,
                   out.data_ptr(), m, heads, width, prec, _threads(cols.numel() * heads * width))
        return out

    def sddmm(self, ptr: torch.Tensor, cols: torch.Tensor, a: torch.Tensor,
              b: torch.Tensor) -> torch.Tensor:
        """[E, H]: for entry e of row i, < a[i, h], b[cols[e], h] > (a [m, H, D], b [n, H, D])."""
        m, heads, width = a.shape
        (a, lda), b = _rows(a), b.to(a.dtype).contiguous()
        out = a.new_empty(cols.numel(), heads)
        ptr, cols, wide = _index(ptr, cols)
        self._sddmm(ptr.data_ptr(), cols.data_ptr(), wide, a.data_ptr(), lda, b.data_ptr(),
                    out.data_ptr(), m, heads, width, a.dtype == torch.float64,
                    _threads(cols.numel() * heads * width))
        return out

    def softmax_vjp(self, ptr: torch.Tensor, cols: torch.Tensor, a: torch.Tensor,
                    b: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """The gradient [E, H] of scores whose softmax over each row's entries is ``p``
        [E, H] (contiguous, of a's dtype), given that of p, ``sddmm(ptr, cols, a, b)``:
        ``p (d - sum over the row of p d)`` per head, computed row by row and written over
        ``p`` (no [E, H] tensor but p)."""
        m, heads, width = a.shape
        (a, lda), b = _rows(a), b.to(a.dtype).contiguous()
        assert p.is_contiguous() and p.dtype == a.dtype and p.shape == (cols.numel(), heads)
        widest = int((ptr[1:] - ptr[:-1]).max()) if m else 0
        ptr, cols, wide = _index(ptr, cols)
        if self._softmax_vjp(ptr.data_ptr(), cols.data_ptr(), wide, a.data_ptr(), lda,
                             b.data_ptr(), p.data_ptr(), m, heads, width, widest,
                             a.dtype == torch.float64,
                             _threads(cols.numel() * heads * width)) != 0:
            raise MemoryError(f"softmax_vjp: no scratch of {widest} x {heads} numbers")
        return p

    def softmax_shares(self, ptr: torch.Tensor, cols: torch.Tensor, a: torch.Tensor,
                       b: torch.Tensor, sc: torch.Tensor, mx: torch.Tensor, s: torch.Tensor,
                       dd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(alpha, ds) [E, H] in a's dtype of a softmax over each row's entries whose row
        statistics are known: ``alpha = exp(sc - mx[i]) / s[i]`` and ``ds = alpha (<a[i],
        b[cols[e]]> - dd[i])`` per head, the dots and arithmetic in double. ``a`` [m, H, D],
        ``b`` [n, H, D], ``sc`` [E, H], ``mx`` [m, H] of a's dtype; ``s``, ``dd`` [m, H]
        (float64)."""
        m, heads, width = a.shape
        (a, lda), b = _rows(a), b.to(a.dtype).contiguous()
        sc, mx = (t.to(a.dtype).reshape(-1, heads).contiguous() for t in (sc, mx))
        s, dd = (t.to(torch.float64).reshape(-1, heads).contiguous() for t in (s, dd))
        assert sc.shape == (cols.numel(), heads) and mx.shape == s.shape == dd.shape == (m, heads)
        alpha, ds = torch.empty_like(sc), torch.empty_like(sc)
        ptr, cols, wide = _index(ptr, cols)
        self._softmax_shares(ptr.data_ptr(), cols.data_ptr(), wide, a.data_ptr(), lda,
                             b.data_ptr(), sc.data_ptr(), mx.data_ptr(), s.data_ptr(),
                             dd.data_ptr(), alpha.data_ptr(), ds.data_ptr(), m, heads, width,
                             a.dtype == torch.float64, _threads(cols.numel() * heads * width))
        return alpha, ds

    def softmax_partial(self, ptr: torch.Tensor, cols: torch.Tensor, sc: torch.Tensor,
                        x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(mx [m, H] in sc's dtype, s [m, H], acc [m, H, D] in float64) of a softmax over each
        row's entries weighing x's rows: ``mx`` the row's max score (-inf for a row without
        entries), ``s = sum exp(sc - mx)``, ``acc = sum exp(sc - mx) x[cols[e]]`` per head, the
        exponentials and sums in double. ``sc`` [E, H], ``x`` [n, H, D] of one dtype."""
        m = ptr.numel() - 1
        _, heads, width = x.shape
        x, ldx = _rows(x)
        sc = sc.reshape(-1, heads).contiguous()
        assert sc.shape == (cols.numel(), heads) and sc.dtype == x.dtype, (sc.shape, sc.dtype)
        mx = sc.new_empty(m, heads)
        s = torch.empty(m, heads, dtype=torch.float64, device=sc.device)
        acc = torch.empty(m, heads, width, dtype=torch.float64, device=sc.device)
        ptr, cols, wide = _index(ptr, cols)
        if self._softmax_partial(ptr.data_ptr(), cols.data_ptr(), wide, sc.data_ptr(),
                                 x.data_ptr(), ldx, mx.data_ptr(), s.data_ptr(), acc.data_ptr(),
                                 m, heads, width, x.dtype == torch.float64,
                                 _threads(cols.numel() * heads * width)) != 0:
            raise MemoryError(f"softmax_partial: no scratch of {heads} numbers")
        return mx, s, acc

    def extremum(self, kind: str, ptr: torch.Tensor, cols: torch.Tensor | None,
                 x: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(y, count) [m, ...]: y[i] the max (``kind`` "max") or min over row i's entries e of
        x[cols[e]] (``cols`` None: x[e]), per number; 0 for a row without entries; count[i]
        how many entries attain it (x's dtype; 0 where a NaN wins). ``x`` [n, ...]."""
        flat = x.contiguous().reshape(x.shape[0], -1)
        width = flat.shape[1]
        y = x.new_empty(m, *x.shape[1:])
        count = torch.empty_like(y)
        if cols is None:
            ptr, wide = ptr.contiguous(), int(ptr.dtype == torch.int64)
        else:
            ptr, cols, wide = _index(ptr, cols)
        entries = int(ptr[-1]) if m else 0
        self._extremum(ptr.data_ptr(), None if cols is None else cols.data_ptr(), wide,
                       flat.data_ptr(), y.data_ptr(), count.data_ptr(), m, width,
                       kind == "max", x.dtype == torch.float64, _threads(entries * width))
        return y, count

    def select_sum(self, ptr: torch.Tensor, cols: torch.Tensor, x: torch.Tensor,
                   y: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """[n, ...]: out[u] = the sum over row u's entries k of ``[x[u] == y[c]] s[c]``,
        c = cols[k], per number (``x`` [n, ...]; ``y``, ``s`` [m, ...]): the gradient of an
        extremum over the transposed index, s its cotangent over the tie count."""
        flat = x.contiguous().reshape(x.shape[0], -1)
        width = flat.shape[1]
        y, s = (t.to(x.dtype).contiguous() for t in (y, s))
        out = torch.empty_like(flat)
        ptr, cols, wide = _index(ptr, cols)
        self._select_sum(ptr.data_ptr(), cols.data_ptr(), wide, flat.data_ptr(), y.data_ptr(),
                         s.data_ptr(), out.data_ptr(), x.shape[0], width,
                         x.dtype == torch.float64, _threads(cols.numel() * width))
        return out.reshape(x.shape)

    def scatter_rows(self, index: torch.Tensor, x: torch.Tensor, n: int) -> torch.Tensor:
        """[n, ...]: out[index[e]] += x[e] for every row e of x, in the order of e (each
        output number summed by one thread: the same whatever the threads). ``index``
        int32 or int64, each in [0, n)."""
        flat = x.contiguous().reshape(x.shape[0], -1)
        width = flat.shape[1]
        index = index.contiguous()
        assert index.dtype in (torch.int32, torch.int64) and index.shape == (x.shape[0],)
        out = torch.zeros(n, width, dtype=x.dtype, device=x.device)
        self._scatter_rows(index.data_ptr(), int(index.dtype == torch.int64), flat.data_ptr(),
                           out.data_ptr(), x.shape[0], width, x.dtype == torch.float64,
                           _threads(x.shape[0] * width) if width >= 2 * SCATTER_COLS else 1)
        return out.reshape(n, *x.shape[1:])


def _threads(work: int) -> int:
    """torch's intra-op threads, or 1 for a product too small to share (a thread costs
    tens of microseconds to start)."""
    return torch.get_num_threads() if work >= SHARED_WORK else 1


def _rows(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """x [n, H, D] as the kernels read it, and its row stride: a gradient broadcast to
    every row (``expand``, as a sum's is) is read as its one row, stride 0; other
    operands contiguous."""
    if x.shape[0] > 1 and x.stride(0) == 0:
        return x[:1].contiguous(), 0
    return x.contiguous(), math.prod(x.shape[1:])


def _index(ptr: torch.Tensor, cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """ptr and cols in one index dtype, contiguous; 1 if it is int64."""
    if ptr.dtype != cols.dtype:
        ptr, cols = ptr.to(torch.int64), cols.to(torch.int64)
    ptr, cols = ptr.contiguous(), cols.contiguous()
    if any(t.numel() and t.data_ptr() == 0 for t in (ptr, cols)):   # never handed C a null
        raise TypeError(f"a graph index without storage ({type(cols).__name__}): sarc.Graph "
                        f"keeps plain tensors")
    return ptr, cols, int(ptr.dtype == torch.int64)


def usable(*tensors: torch.Tensor) -> bool:
    """Whether the kernels take these operands: CPU tensors of one float dtype they know,
    each with its storage (a wrapper subclass's ``data_ptr()`` is 0: torch's ops read it)."""
    return all(t.device.type == "cpu" for t in tensors) and tensors[0].dtype in DTYPES and \
        all(t.dtype == tensors[0].dtype for t in tensors) and \
        all(t.numel() == 0 or t.data_ptr() != 0 for t in tensors)


def kernels() -> Kernels | None:
    """The kernels, built and loaded on first use; None where they cannot be (no C
    compiler, ``SARC_CPU_KERNELS=0``). Called on every sparse op: after the first call
    for a ``$CC``, a dictionary lookup."""
    if os.environ.get("SARC_CPU_KERNELS", "1") == "0":
        return None
    cc = os.environ.get("CC")
    if cc not in _loaded:
        with _lock:
            if cc not in _loaded:
                compiler = cc or shutil.which("cc") or shutil.which("gcc")
                _loaded[cc] = _build(compiler) if compiler else None
    return _loaded[cc]


def kernels_for(*tensors: torch.Tensor) -> Kernels | None:
    """The kernels where they are built and take these operands (``usable``), else None."""
    return kernels() if usable(*tensors) else None


def _build(compiler: str) -> Kernels | None:
    source = SOURCE.read_bytes()
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    digest = hashlib.sha256(b"\0".join([source, " ".join(FLAGS).encode(), version.encode(),
                                        _cpu().encode()])).hexdigest()[:16]
    path = cache_dir() / f"cpu_kernels_{digest}.so"
    if not path.exists():
        try:
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".cpu_kernels.", suffix=".so")
        except OSError as e:
            raise cannot_write_cache(path, e) from None
        os.close(fd)
        try:
            for flags in ((NATIVE, *FLAGS), FLAGS):
                proc = subprocess.run([compiler, *flags, "-o", tmp, str(SOURCE), "-lm"],
                                      capture_output=True, text=True, timeout=300)
                if proc.returncode == 0:
                    os.replace(tmp, path)
                    break
            else:
                return None
        except (OSError, subprocess.SubprocessError):
            return None
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    try:
        return Kernels(ctypes.CDLL(str(path)), path)
    except OSError:
        return None


def _cpu() -> str:
    """What ``-march=native`` compiles for: the machine and its CPU's flags."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()} {flags}"
