"""sarc's CPU kernels (``sarc/native/kernels.c``) against dense float64
references, on random CSR matrices with hubs, empty rows and repeated entries; the torch
products they replace where they cannot be built."""
from __future__ import annotations

import os

import pytest
import torch

from sarc.backends import torch_ops
from sarc.native import kernels as cpu_kernels
from sarc.graph import Graph

K = cpu_kernels.kernels()
needs_kernels = pytest.mark.skipif(K is None, reason="no C compiler builds the CPU kernels here")


def _csr(m: int, n: int, seed: int, index_dtype):
    """A random CSR pattern: every 7th row empty, row 1 a hub, repeated (row, col) pairs."""
    gen = torch.Generator().manual_seed(seed)
    deg = torch.randint(0, 6, (m,), generator=gen)
    deg[::7] = 0
    deg[1] = 3 * n
    ptr = torch.zeros(m + 1, dtype=torch.int64)
    ptr[1:] = torch.cumsum(deg, 0)
    cols = torch.randint(0, n, (int(ptr[-1]),), generator=gen)
    return ptr.to(index_dtype), cols.to(index_dtype), gen


def _dense(ptr, cols, w, m, n):
    """[H, m, n] float64: entry (i, j) of head h the sum of w[e, h] over row i's entries in j."""
    heads = w.shape[1]
    rows = torch.repeat_interleave(torch.arange(m), (ptr[1:] - ptr[:-1]).long())
    a = torch.zeros(heads, m, n, dtype=torch.float64)
    for h in range(heads):
        a[h].index_put_((rows, cols.long()), w[:, h].double(), accumulate=True)
    return a


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("heads,width", [(1, 1), (1, 7), (1, 64), (1, 130), (4, 16), (3, 33)])
@pytest.mark.parametrize("weighted", [False, True])
def test_spmm_is_the_dense_product(dtype, index_dtype, heads, width, weighted):
    m, n = 40, 30
    ptr, cols, gen = _csr(m, n, heads * 100 + width, index_dtype)
    x = torch.randn(n, heads, width, generator=gen, dtype=torch.float64).to(dtype)
    w = torch.randn(cols.numel(), heads, generator=gen, dtype=torch.float64).to(dtype)
    got = K.spmm(ptr, cols, w if weighted else None, x, m)
    a = _dense(ptr, cols, w if weighted else torch.ones(cols.numel(), heads), m, n)
    want = torch.einsum("hmn,nhd->mhd", a, x.double())
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * 10)
    assert got.dtype == dtype and got.shape == (m, heads, width)


@needs_kernels
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("heads,width", [(1, 7), (4, 16)])
def test_spmm_reads_the_weights_through_an_index(index_dtype, heads, width):
    """Weights given as rows of a table and each entry's row (a transposed index's order):
    the product with the table's rows gathered."""
    m, n = 40, 30
    ptr, cols, gen = _csr(m, n, 7 + heads, index_dtype)
    x = torch.randn(n, heads, width, generator=gen)
    table = torch.randn(cols.numel() + 5, heads, generator=gen)
    index = torch.randperm(cols.numel() + 5, generator=gen)[:cols.numel()]
    got = K.spmm(ptr, cols, table, x, m, index)
    torch.testing.assert_close(got, K.spmm(ptr, cols, table[index], x, m), rtol=0, atol=0)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("heads,width", [(1, 1), (1, 100), (4, 8), (2, 65)])
def test_sddmm_is_each_entrys_dot_product(dtype, index_dtype, heads, width):
    m, n = 35, 25
    ptr, cols, gen = _csr(m, n, 7 * heads + width, index_dtype)
    a = torch.randn(m, heads, width, generator=gen, dtype=torch.float64).to(dtype)
    b = torch.randn(n, heads, width, generator=gen, dtype=torch.float64).to(dtype)
    got = K.sddmm(ptr, cols, a, b)
    rows = torch.repeat_interleave(torch.arange(m), (ptr[1:] - ptr[:-1]).long())
    want = (a.double()[rows] * b.double()[cols.long()]).sum(2)
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * 10)


@needs_kernels
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("heads,width", [(1, 1), (4, 8), (2, 130)])
def test_spmm_in_double_reads_a_float_operand_as_it_is(index_dtype, heads, width):
    """Weights, sums and result in float64 over a float32 x: the product of x's float64
    copy, bit for bit (the same sums in the same order), with scales and a transposed
    index's weights."""
    m, n = 30, 20
    ptr, cols, gen = _csr(m, n, 11 * heads + width, index_dtype)
    x = torch.randn(n, heads, width, generator=gen)
    w = torch.randn(cols.numel(), heads, generator=gen, dtype=torch.float64)
    rs, cs = torch.rand(m, generator=gen, dtype=torch.float64), torch.rand(n, generator=gen,
                                                                            dtype=torch.float64)
    widx = torch.randperm(cols.numel(), generator=gen)
    for args in ((), (widx, rs, cs)):
        got = K.spmm(ptr, cols, w, x, m, *args, dtype=torch.float64)
        assert got.dtype == torch.float64
        assert torch.equal(got, K.spmm(ptr, cols, w, x.double(), m, *args))
    with pytest.raises(AssertionError):  # float32 sums over a float64 x: not a mode
        K.spmm(ptr, cols, w.float(), x.double(), m, dtype=torch.float32)


def _softmax_vjp_reference(ptr, cols, a, b, p):
    """p (d - sum over the row of p d) per head, d the SDDMM of a and b: float64."""
    m = a.shape[0]
    rows = torch.repeat_interleave(torch.arange(m), (ptr[1:] - ptr[:-1]).long())
    d = (a.double()[rows] * b.double()[cols.long()]).sum(2)
    pd = p.double() * d
    sums = torch.zeros(m, p.shape[1], dtype=torch.float64).index_add_(0, rows, pd)
    return pd - p.double() * sums[rows]


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("heads,width", [(1, 1), (1, 100), (4, 8), (3, 33)])
def test_softmax_vjp_is_the_softmax_gradient_over_each_row(dtype, index_dtype, heads, width):
    """Written over p, for rows with no entries, a hub row (longer than any other: the
    thread's scratch) and repeated entries; p a softmax over each row's entries."""
    m, n = 35, 25
    ptr, cols, gen = _csr(m, n, 3 * heads + width, index_dtype)
    a = torch.randn(m, heads, width, generator=gen, dtype=torch.float64).to(dtype)
    b = torch.randn(n, heads, width, generator=gen, dtype=torch.float64).to(dtype)
    rows = torch.repeat_interleave(torch.arange(m), (ptr[1:] - ptr[:-1]).long())
    s = torch.randn(cols.numel(), heads, generator=gen, dtype=torch.float64)
    e = (s - s.max()).exp()
    p = (e / torch.zeros(m, heads, dtype=torch.float64).index_add_(0, rows, e)[rows]).to(dtype)
    want = _softmax_vjp_reference(ptr, cols, a, b, p)
    q = p.clone()
    got = K.softmax_vjp(ptr, cols, a, b, q)
    assert got.data_ptr() == q.data_ptr()
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * 10)
    # each row's gradient sums to zero per head (the second pass takes off the rounding)
    sums = torch.zeros(m, heads, dtype=torch.float64).index_add_(0, rows, got.double())
    assert sums.abs().max() <= (1e-14 if dtype == torch.float64 else 1e-6)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("heads,width", [(1, 1), (4, 8), (3, 33)])
@pytest.mark.parametrize("broadcast", [False, True])
def test_softmax_shares_are_the_weights_and_score_gradients_in_double(dtype, index_dtype, heads,
                                                                      width, broadcast):
    """alpha = exp(sc - mx) / s and ds = alpha (<a, b> - dd) per entry: both rounded once
    from double (the dots of floats are exact products summed in double), for rows with
    no entries, a hub row and repeated entries; ``a`` broadcast to every row (stride 0)."""
    m, n = 35, 25
    ptr, cols, gen = _csr(m, n, 5 * heads + width, index_dtype)
    a = torch.randn(1 if broadcast else m, heads, width, generator=gen, dtype=torch.float64)
    a = (a.expand(m, heads, width) if broadcast else a).to(dtype)
    b = torch.randn(n, heads, width, generator=gen, dtype=torch.float64).to(dtype)
    rows = torch.repeat_interleave(torch.arange(m), (ptr[1:] - ptr[:-1]).long())
    sc = (torch.randn(cols.numel(), heads, generator=gen, dtype=torch.float64) * 5).to(dtype)
    mx = torch.full((m, heads), -1e30, dtype=torch.float64).index_reduce_(
        0, rows, sc.double(), "amax").to(dtype)
    ex = torch.exp(sc.double() - mx.double()[rows])
    s = torch.ones(m, heads, dtype=torch.float64).index_add_(0, rows, ex) - 1
    s = torch.where(s > 0, s, 1.0)
    dd = torch.randn(m, heads, generator=gen, dtype=torch.float64)
    alpha, ds = K.softmax_shares(ptr, cols, a, b, sc, mx, s, dd)
    want_alpha = ex / s[rows]
    dots = (a.double()[rows] * b.double()[cols.long()]).sum(2)
    want_ds = want_alpha * (dots - dd[rows])
    assert alpha.dtype == ds.dtype == dtype
    if dtype == torch.float64:
        torch.testing.assert_close(alpha, want_alpha, rtol=1e-14, atol=0)
        torch.testing.assert_close(ds, want_ds, rtol=1e-12, atol=1e-15)
    else:  # correctly rounded, to a unit in the last place
        assert torch.equal(alpha, want_alpha.to(dtype)) or \
            ((alpha.double() - want_alpha).abs() <= 1.2e-7 * want_alpha.abs()).all()
        assert ((ds.double() - want_ds).abs() <= 1.2e-7 * want_ds.abs() + 1e-30).all()


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("heads,width", [(1, 1), (4, 8), (3, 33)])
def test_softmax_partial_is_each_rows_online_softmax_state(dtype, index_dtype, heads, width):
    """(max, sum of exp(sc - max), sum of exp(sc - max) x[col]) per row and head, against
    float64 references; a row without entries: (-inf, 0, 0)."""
    m, n = 40, 30
    ptr, cols, gen = _csr(m, n, 5 * heads + width, index_dtype)
    sc = (8 * torch.randn(cols.numel(), heads, generator=gen, dtype=torch.float64)).to(dtype)
    x = torch.randn(n, heads, width, generator=gen, dtype=torch.float64).to(dtype)
    mx, s, acc = K.softmax_partial(ptr, cols, sc, x)
    p = ptr.long()
    rows = torch.repeat_interleave(torch.arange(m), p[1:] - p[:-1])
    want_m = torch.full((m, heads), float("-inf"), dtype=dtype).index_reduce(0, rows, sc, "amax")
    ex = torch.exp(sc.double() - want_m.double()[rows])
    want_s = torch.zeros(m, heads, dtype=torch.float64).index_add_(0, rows, ex)
    want_acc = torch.zeros(m, heads, width, dtype=torch.float64).index_add_(
        0, rows, ex.unsqueeze(-1) * x.double()[cols.long()])
    assert torch.equal(mx, want_m) and mx.dtype == dtype
    assert s.dtype == acc.dtype == torch.float64
    torch.testing.assert_close(s, want_s, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(acc, want_acc, rtol=1e-12, atol=1e-12)
    empty = p[1:] == p[:-1]
    assert empty.any() and (s[empty] == 0).all() and (acc[empty] == 0).all()


def _extremum_reference(kind, ptr, xe):
    """(y, count, the row of each entry) of ``kind`` over each CSR row of the per-entry rows
    ``xe``, in torch: y 0 for an empty row; count: the entries equal to y."""
    ptr = ptr.long()
    y = torch.segment_reduce(xe, kind, offsets=ptr, axis=0)
    has = (ptr[1:] > ptr[:-1]).view(-1, *[1] * (xe.dim() - 1))
    y = torch.where(has, y, torch.zeros((), dtype=xe.dtype))
    rows = torch.repeat_interleave(torch.arange(ptr.numel() - 1), ptr[1:] - ptr[:-1])
    count = torch.segment_reduce((xe == y[rows]).to(xe.dtype), "sum", offsets=ptr, axis=0)
    return y, count, rows


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("kind", ["max", "min"])
@pytest.mark.parametrize("shape", [(1,), (7,), (64,), (130,), (4, 16)])
def test_extremum_is_each_rows_max_or_min_with_its_tie_count(dtype, index_dtype, kind, shape):
    """Small integers: many entries tie for a row's extremum (repeated columns too); the
    same from a column index and from rows given per entry (``cols`` None)."""
    m, n = 40, 30
    ptr, cols, gen = _csr(m, n, 7 * len(shape) + shape[-1], index_dtype)
    x = torch.randint(-3, 4, (n, *shape), generator=gen).to(dtype)
    x[2].view(-1)[0] = float("-inf")
    y, count = K.extremum(kind, ptr, cols, x, m)
    want_y, want_count, _ = _extremum_reference(kind, ptr, x[cols.long()])
    assert torch.equal(y, want_y) and torch.equal(count, want_count)
    assert y.dtype == count.dtype == dtype and y.shape == (m, *shape)
    rows_with_entries = int((ptr[1:] > ptr[:-1]).sum())
    assert int((count >= 1).sum()) == rows_with_entries * x[0].numel()  # no NaN: a tie or more
    per_entry = K.extremum(kind, ptr, None, x[cols.long()], m)
    assert torch.equal(per_entry[0], y) and torch.equal(per_entry[1], count)


@needs_kernels
@pytest.mark.parametrize("kind", ["max", "min"])
def test_a_nan_is_its_rows_extremum_and_ties_with_nothing(kind):
    """As torch's max: a NaN among a row's entries is the row's result, whatever comes
    after it, and no entry attains it (its gradient goes nowhere)."""
    ptr = torch.tensor([0, 3, 5, 6])
    x = torch.tensor([[1.0], [float("nan")], [5.0], [-2.0]])
    cols = torch.tensor([0, 1, 2, 2, 3, 1])
    y, count = K.extremum(kind, ptr, cols, x, 3)
    assert torch.isnan(y[0, 0]) and torch.isnan(y[2, 0]) and count[0, 0] == count[2, 0] == 0
    assert y[1, 0] == (5.0 if kind == "max" else -2.0) and count[1, 0] == 1


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("shape", [(1,), (70,), (3, 5)])
def test_select_sum_is_the_extremums_gradient_over_the_transposed_index(dtype, index_dtype, shape):
    """dx[u] = sum over the entries (v, u) of [x[u] == y[v]] s[v]: the scatter of the tied
    entries' shares, computed row by row of the transpose."""
    m, n = 40, 30
    ptr, cols, gen = _csr(m, n, 3 + shape[-1], index_dtype)
    x = torch.randint(-2, 3, (n, *shape), generator=gen).to(dtype)
    y, count, rows = _extremum_reference("max", ptr, x[cols.long()])
    s = torch.randn(m, *shape, generator=gen, dtype=torch.float64).to(dtype) / count.clamp(min=1)
    colptr, rows_t, _ = torch_ops.transpose(cols.long(), rows, n, index_dtype)
    got = K.select_sum(colptr, rows_t, x, y, s)
    tie = (x[cols.long()] == y[rows]).to(torch.float64)
    want = torch.zeros(n, *shape, dtype=torch.float64).index_add_(0, cols.long(),
                                                                  tie * s[rows].double())
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    assert got.dtype == dtype and got.shape == x.shape and tie.sum() > 0


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("shape", [(1,), (33,), (100,), (3, 40)])
def test_scatter_rows_adds_each_row_at_its_index(dtype, index_dtype, shape):
    """out[idx[e]] += x[e] (repeated indices, rows no index reaches), as index_add_."""
    gen = torch.Generator().manual_seed(shape[-1])
    idx = torch.randint(0, 20, (300,), generator=gen)
    idx[idx == 7] = 8
    x = torch.randn(300, *shape, generator=gen, dtype=torch.float64).to(dtype)
    got = K.scatter_rows(idx.to(index_dtype), x, 25)
    want = torch.zeros(25, *shape, dtype=torch.float64).index_add_(0, idx, x.double())
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    assert got.dtype == dtype and got.shape == (25, *shape) and (got[7] == 0).all()


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_an_operand_broadcast_to_every_row_is_read_as_one_row(dtype):
    """A gradient expanded from one row (a sum's: stride 0) is read in place, not copied:
    spmm's x, sddmm's and softmax_vjp's a give what their contiguous copies give."""
    m, n = 40, 30
    ptr, cols, gen = _csr(m, n, 11, torch.int64)
    w = torch.randn(cols.numel(), 3, generator=gen, dtype=dtype)
    b = torch.randn(n, 3, 5, generator=gen, dtype=dtype)
    row = torch.randn(1, 3, 5, generator=gen, dtype=dtype)
    for rows in (n, m):
        wide = row.expand(rows, 3, 5)
        assert wide.stride(0) == 0
        if rows == n:
            assert torch.equal(K.spmm(ptr, cols, w, wide, m), K.spmm(ptr, cols, w, wide.contiguous(), m))
        else:
            assert torch.equal(K.sddmm(ptr, cols, wide, b), K.sddmm(ptr, cols, wide.contiguous(), b))
            p = torch.rand(cols.numel(), 3, generator=gen, dtype=dtype)
            assert torch.equal(K.softmax_vjp(ptr, cols, wide, b, p.clone()),
                               K.softmax_vjp(ptr, cols, wide.contiguous(), b, p.clone()))
    scalar = torch.ones((), dtype=dtype).expand(n, 3, 5)  # every stride 0, as out.sum()'s
    assert torch.equal(K.spmm(ptr, cols, w, scalar, m), K.spmm(ptr, cols, w, scalar.contiguous(), m))


@needs_kernels
def test_spmm_writes_into_a_given_tensor_of_any_shape():
    m, n = 40, 30
    ptr, cols, gen = _csr(m, n, 5, torch.int64)
    x = torch.randn(n, 2, 4, generator=gen)
    out = torch.empty(m, 8)
    assert K.spmm(ptr, cols, None, x, m, out=out).data_ptr() == out.data_ptr()
    assert torch.equal(out, K.spmm(ptr, cols, None, x, m).reshape(m, 8))


@needs_kernels
def test_the_result_does_not_depend_on_the_threads():
    ptr, cols, gen = _csr(3000, 500, 1, torch.int32)
    x = torch.randn(500, 2, 40, generator=gen)
    a = torch.randn(3000, 2, 40, generator=gen)
    w = torch.randn(cols.numel(), 2, generator=gen)
    before = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 2, 5):
            torch.set_num_threads(threads)
            y, count = K.extremum("max", ptr, cols, x.round(), 3000)
            outs.append((K.spmm(ptr, cols, w, x, 3000), K.sddmm(ptr, cols, a, x),
                         K.softmax_vjp(ptr, cols, a, x, w.abs().contiguous()), y, count,
                         K.select_sum(ptr, cols, a.round(), x.round(), a),
                         K.scatter_rows(cols, x.index_select(0, cols.long()), 500)))
    finally:
        torch.set_num_threads(before)
    for got in outs[1:]:
        assert all(torch.equal(y, z) for y, z in zip(got, outs[0]))


def _layer_outputs(monkeypatch, built: bool):
    """A weighted multi-head sum and a mean through ``torch_ops.spmm``, and a max and a min
    of integers (ties) through ``torch_ops.extremum_spmm``, with their gradients, with or
    without the kernels."""
    if not built:
        monkeypatch.setattr(cpu_kernels, "kernels", lambda: None)
    gen = torch.Generator().manual_seed(0)
    src = torch.randint(0, 50, (400,), generator=gen)
    dst = torch.randint(0, 50, (400,), generator=gen)
    g = Graph.from_edges(src, dst, 50)
    x = torch.randn(50, 4, 8, generator=gen, requires_grad=True)
    w = torch.randn(400, 4, 1, generator=gen, requires_grad=True)
    y = torch_ops.spmm("sum", g, x, w) + torch_ops.spmm("mean", g, x)
    y.pow(2).sum().backward()
    z = torch.randint(-2, 3, (50, 4, 8), generator=gen).float().requires_grad_()
    picked = torch_ops.extremum_spmm("max", g, z) - 2 * torch_ops.extremum_spmm("min", g, z)
    (picked * torch.randn(picked.shape, generator=gen)).sum().backward()
    return y.detach(), x.grad, w.grad, picked.detach(), z.grad


@needs_kernels
def test_the_torch_backend_gives_torchs_products_without_the_kernels(monkeypatch):
    with_kernels = _layer_outputs(monkeypatch, True)
    without = _layer_outputs(monkeypatch, False)
    for a, b in zip(with_kernels, without):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_no_compiler_means_no_kernels_and_nothing_left_behind(monkeypatch, tmp_path):
    monkeypatch.setenv("SARC_CACHE_DIR", str(tmp_path / "cache"))
    assert cpu_kernels._build("/bin/false") is None          # compiles nothing
    assert cpu_kernels._build(str(tmp_path / "no-such-cc")) is None
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    monkeypatch.setenv("SARC_CPU_KERNELS", "0")
    assert cpu_kernels.kernels() is None


@needs_kernels
def test_the_library_is_built_once_into_the_private_cache():
    from sarc.native.cache import cache_dir
    assert K.path.parent == cache_dir() and K.path.name.startswith("cpu_kernels_")
    assert oct(os.stat(cache_dir()).st_mode & 0o777) == "0o700"
    assert cpu_kernels.kernels() is K


@needs_kernels
@pytest.mark.parametrize("seed", range(4))
def test_transpose_is_the_stable_argsort_by_column(seed):
    gen = torch.Generator().manual_seed(seed)
    num_cols = 50
    cols = torch.randint(0, num_cols - 5, (700,), generator=gen)  # the last columns empty
    rows = torch.sort(torch.randint(0, 90, (700,), generator=gen)).values
    ptr, rows_t, order = K.transpose(cols.to(torch.int32), rows, num_cols)
    want = torch.argsort(cols, stable=True)
    assert torch.equal(order, want) and torch.equal(rows_t, rows[want])
    assert torch.equal(ptr[1:] - ptr[:-1], torch.bincount(cols, minlength=num_cols))


@pytest.mark.parametrize("seed", range(3))
def test_a_graph_of_edges_in_csr_order_is_the_sorted_graph(seed):
    """``Graph.from_edges`` skips its sort when the edges come grouped by destination (a
    sampled block's do): the same graph as from the shuffled edges, sorted."""
    gen = torch.Generator().manual_seed(seed)
    dst = torch.sort(torch.randint(0, 40, (300,), generator=gen)).values
    src = torch.randint(0, 60, (300,), generator=gen)
    shuffled = torch.randperm(300, generator=gen)
    a = Graph.from_edges(src, dst, num_src=60, num_dst=40)
    b = Graph.from_edges(src[shuffled], dst[shuffled], num_src=60, num_dst=40)
    assert torch.equal(a.perm, torch.arange(300)) and torch.equal(a.src, src)
    for name in ("dst", "rowptr", "in_degree", "out_degree"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    # within a destination, the edges in their input order: the same edges
    assert torch.equal(torch.sort(a.dst * 60 + a.src).values, torch.sort(b.dst * 60 + b.src).values)
    assert torch.equal(b.src, src[shuffled][b.perm])


@needs_kernels
def test_an_operand_without_storage_never_reaches_the_kernels():
    """A wrapper tensor subclass (PyG's ``Index``, ``data_ptr()`` 0) handed C a null
    pointer: a segfault. An index is refused (``sarc.Graph`` keeps plain copies)."""
    tg = pytest.importorskip("torch_geometric")
    ptr, cols, _ = _csr(5, 4, 0, torch.int64)
    wrapped = tg.Index(cols)
    assert wrapped.data_ptr() == 0
    with pytest.raises(TypeError, match="a graph index without storage"):
        K.spmm(ptr, wrapped, None, torch.randn(4, 1, 3), 5)
