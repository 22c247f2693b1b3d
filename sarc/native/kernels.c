/* The CPU kernels of sarc (sarc/native/kernels.py): the torch backend's sparse
   products, the transpose of an edge index, and neighbour sampling's per-node draws.

   A CSR matrix of m rows: row i's entries are ptr[i] .. ptr[i+1]-1, entry e in column
   cols[e]. Dense operands are row-major [rows, H, D]: H heads of D numbers.

   spmm:  out[i, h, :] = rs[i] * sum over the entries e of row i of
                                       w[k, h] * cs[cols[e]] * x[cols[e], h, :],
          k = widx[e] (widx NULL: k = e; w NULL: weight 1; rs, cs NULL: scale 1); in
          float, in double, or in double over a float x (read as it is, not copied)
   sddmm: out[e, h]    = < a[i, h, :], b[cols[e], h, :] >  for each entry e of row i
   softmax_vjp: p[e, h] <- p[e, h] (d[e, h] - sum over row i's entries f of p[f, h] d[f, h])
          with d[e, h] = < a[i, h, :], b[cols[e], h, :] >: the gradient of the scores whose
          softmax over each row is p, given d, the gradient of p (an SDDMM), written over p
   softmax_shares: alpha[e, h] = exp(sc[e, h] - mx[i, h]) / s[i, h] and
          ds[e, h] = alpha[e, h] (< a[i, h, :], b[cols[e], h, :] > - dd[i, h]): the share of
          the scores' gradient of a softmax whose row statistics (max mx, sum s, the
          output's dot dd) are known, its dots and arithmetic in double whatever T
   softmax_partial: mx[i, h] = max over row i's entries of sc[e, h], s[i, h] = sum
          exp(sc[e, h] - mx[i, h]) and acc[i, h, :] = sum exp(sc[e, h] - mx[i, h])
          x[cols[e], h, :], in double: a row's share of a softmax aggregate, merged online
   scatter_rows: out[idx[e], :] += x[e, :] (a gather's gradient)
   extremum: y[i, f] = the max (min) over the entries e of row i of x[cols[e], f] (cols
          NULL: x[e, f]), 0 for a row without entries, and cnt[i, f] = how many attain it
          (a NaN wins and is attained by none)
   select_sum: out[u, f] = sum over the entries k of row u of [x[u, f] == y[c, f]] s[c, f],
          c = cols[k]: an extremum's gradient over the transposed index (s = g / cnt)

   The operand read by row (spmm's x by column, sddmm's and softmax_vjp's a by row) has a
   row stride `ld` (H * D, or 0 for one row broadcast to all: an expanded gradient).

   Rows are dealt to `threads` POSIX threads in chunks of 32 by an atomic counter (a
   power-law graph's rows differ in length by orders of magnitude). A row's sums are
   accumulated in registers over chunks of 128 / 64 / 16 numbers of D and written once;
   the next entries' source rows are prefetched. Entries are added in CSR order, so the
   result does not depend on the number of threads. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#define ROWS_PER_GRAB 32
#define AHEAD 4

typedef struct {
  const void *ptr, *cols;
  int index64;                  /* ptr and cols are int64 (else int32) */
  const void *w, *x, *a;        /* spmm: w (or NULL), x; sddmm: a, x is b */
  const int64_t *widx;          /* spmm: the row of w of each entry (NULL: the entry's) */
  const void *rs, *cs;          /* spmm: a scale per row, per column (or NULL) */
  void *out;
  int64_t m, H, D;
  int64_t ld;                   /* the row stride of spmm's x, sddmm's a */
  int64_t next;                 /* the next row to hand out */
  int64_t widest;               /* softmax_vjp: the most entries of a row */
  const void *sc, *mx;          /* softmax_shares: the scores, their row maxima (T) */
  const double *s, *dd;         /* softmax_shares: the row sums, the output's dots */
  void *ds;                     /* softmax_shares: the scores' gradient (out: alpha);
                                   softmax_partial: the row maxima (out) */
  double *sums;                 /* softmax_partial: the row sums (out) */
} Job;

static inline int64_t at(const void *p, int index64, int64_t i) {
  return index64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}

/* for each row i this thread takes: ROWS_PER_GRAB at a time from the counter *next */
#define EACH_ROW(i, next, n)                                                           \
  for (int64_t i##0 = __atomic_fetch_add(next, ROWS_PER_GRAB, __ATOMIC_RELAXED);       \
       i##0 < (n); i##0 = __atomic_fetch_add(next, ROWS_PER_GRAB, __ATOMIC_RELAXED))   \
    for (int64_t i = i##0, i##1 = i##0 + ROWS_PER_GRAB < (n) ? i##0 + ROWS_PER_GRAB : (n); \
         i < i##1; i++)

#define SPMM_CHUNK(T, TX, C)                                                          \
  {                                                                                   \
    T acc[C];                                                                         \
    for (int f = 0; f < C; f++) acc[f] = 0;                                           \
    for (int64_t e = lo; e < hi; e++) {                                               \
      const int64_t col = at(job->cols, job->index64, e);                             \
      const TX *xr = x + col * ld + off;                                              \
      if (e + AHEAD < hi)                                                             \
        __builtin_prefetch(x + at(job->cols, job->index64, e + AHEAD) * ld + off);    \
      T v = w ? w[(widx ? widx[e] : e) * H + h] : (T)1;                               \
      if (cs) v *= cs[col];                                                           \
      for (int f = 0; f < C; f++) acc[f] += v * xr[f];                                \
    }                                                                                 \
    for (int f = 0; f < C; f++) o[off + f] = r * acc[f];                              \
    off += C;                                                                         \
  }

#define DEFINE_SPMM(T, TX, NAME)                                                      \
  static void *NAME##_rows(void *arg) {                                               \
    Job *job = (Job *)arg;                                                            \
    const TX *x = (const TX *)job->x;                                                 \
    const T *w = (const T *)job->w;                                                   \
    const T *rs = (const T *)job->rs, *cs = (const T *)job->cs;                       \
    const int64_t *widx = job->widx;                                                  \
    const int64_t H = job->H, D = job->D, row = H * D, ld = job->ld;                  \
    EACH_ROW(i, &job->next, job->m) {                                                \
      const int64_t lo = at(job->ptr, job->index64, i);                               \
      const int64_t hi = at(job->ptr, job->index64, i + 1);                           \
      T *o = (T *)job->out + i * row;                                                 \
      const T r = rs ? rs[i] : (T)1;                                                  \
      for (int64_t h = 0; h < H; h++) {                                               \
        int64_t off = h * D;                                                          \
        const int64_t end = off + D;                                                  \
        while (end - off >= 128) SPMM_CHUNK(T, TX, 128)                               \
        while (end - off >= 64) SPMM_CHUNK(T, TX, 64)                                 \
        while (end - off >= 16) SPMM_CHUNK(T, TX, 16)                                 \
        while (end - off >= 1) SPMM_CHUNK(T, TX, 1)                                   \
      }                                                                               \
    }                                                                                 \
    return 0;                                                                         \
  }

/* d[h] = < ar[h, :], b[cols[e], h, :] > for each head h of entry e, the next entries'
   rows of b prefetched */
#define DOTS(T, d)                                                                    \
  {                                                                                   \
    const T *br = b + at(job->cols, job->index64, e) * row;                           \
    if (e + AHEAD < hi)                                                               \
      __builtin_prefetch(b + at(job->cols, job->index64, e + AHEAD) * row);           \
    for (int64_t h = 0; h < H; h++) {                                                 \
      T s = 0;                                                                        \
      for (int64_t f = 0; f < D; f++) s += ar[h * D + f] * br[h * D + f];             \
      (d)[h] = s;                                                                     \
    }                                                                                 \
  }

#define DEFINE_SDDMM(T, NAME)                                                         \
  static void *NAME##_rows(void *arg) {                                               \
    Job *job = (Job *)arg;                                                            \
    const T *a = (const T *)job->a, *b = (const T *)job->x;                           \
    T *out = (T *)job->out;                                                           \
    const int64_t H = job->H, D = job->D, row = H * D;                                \
    EACH_ROW(i, &job->next, job->m) {                                                \
      const int64_t lo = at(job->ptr, job->index64, i);                               \
      const int64_t hi = at(job->ptr, job->index64, i + 1);                           \
      const T *ar = a + i * job->ld;                                                  \
      for (int64_t e = lo; e < hi; e++) DOTS(T, out + e * H)                          \
    }                                                                                 \
    return 0;                                                                         \
  }

/* Row i's p d into a scratch of the longest row's size, then twice (the second over the
   first's rounding) its sum per head, in double, taken off in shares of p: the steps of
   sarc.backends.torch_ops._softmax_vjp_into on one row. */
#define DEFINE_SOFTMAX_VJP(T, NAME)                                                   \
  static void *NAME##_rows(void *arg) {                                               \
    Job *job = (Job *)arg;                                                            \
    const T *a = (const T *)job->a, *b = (const T *)job->x;                           \
    T *p = (T *)job->out;                                                             \
    const int64_t H = job->H, D = job->D, row = H * D;                                \
    T *t = (T *)malloc(sizeof(T) * (job->widest > 0 ? job->widest : 1) * H);         \
    if (!t) return 0; /* the rows go to the other threads */                          \
    EACH_ROW(i, &job->next, job->m) {                                                \
      const int64_t lo = at(job->ptr, job->index64, i);                               \
      const int64_t hi = at(job->ptr, job->index64, i + 1);                           \
      const T *ar = a + i * job->ld;                                                  \
      for (int64_t e = lo; e < hi; e++) {                                             \
        T *d = t + (e - lo) * H;                                                      \
        DOTS(T, d)                                                                    \
        for (int64_t h = 0; h < H; h++) d[h] *= p[e * H + h];                         \
      }                                                                               \
      for (int64_t h = 0; h < H; h++)                                                 \
        for (int pass = 0; pass < 2; pass++) {                                        \
          double c = 0;                                                               \
          for (int64_t k = 0; k < hi - lo; k++) c += t[k * H + h];                    \
          const T share = (T)c;                                                       \
          for (int64_t k = 0; k < hi - lo; k++) t[k * H + h] -= share * p[(lo + k) * H + h]; \
        }                                                                             \
      for (int64_t k = 0; k < (hi - lo) * H; k++) p[lo * H + k] = t[k];               \
    }                                                                                 \
    free(t);                                                                          \
    return 0;                                                                         \
  }

/* Row i's weights and score gradients from its statistics: one pass over its entries,
   the dots accumulated in double (products of two floats are exact there), so that a
   row's gradients cancel as they do in double (sarc.backends.torch_blocks). */
#define DEFINE_SOFTMAX_SHARES(T, NAME)                                                \
  static void *NAME##_rows(void *arg) {                                               \
    Job *job = (Job *)arg;                                                            \
    const T *a = (const T *)job->a, *b = (const T *)job->x;                           \
    const T *sc = (const T *)job->sc, *mx = (const T *)job->mx;                       \
    T *alpha = (T *)job->out, *ds = (T *)job->ds;                                     \
    const int64_t H = job->H, D = job->D, row = H * D;                                \
    EACH_ROW(i, &job->next, job->m) {                                                \
      const int64_t lo = at(job->ptr, job->index64, i);                               \
      const int64_t hi = at(job->ptr, job->index64, i + 1);                           \
      const T *ar = a + i * job->ld;                                                  \
      for (int64_t e = lo; e < hi; e++) {                                             \
        const T *br = b + at(job->cols, job->index64, e) * row;                       \
        if (e + AHEAD < hi)                                                           \
          __builtin_prefetch(b + at(job->cols, job->index64, e + AHEAD) * row);       \
        for (int64_t h = 0; h < H; h++) {                                             \
          double dot = 0;                                                             \
          for (int64_t f = 0; f < D; f++)                                             \
            dot += (double)ar[h * D + f] * (double)br[h * D + f];                     \
          const double w = exp((double)sc[e * H + h] - (double)mx[i * H + h])         \
                           / job->s[i * H + h];                                       \
          alpha[e * H + h] = (T)w;                                                    \
          ds[e * H + h] = (T)(w * (dot - job->dd[i * H + h]));                        \
        }                                                                             \
      }                                                                               \
    }                                                                                 \
    return 0;                                                                         \
  }

DEFINE_SPMM(float, float, spmm_f32)
DEFINE_SPMM(double, double, spmm_f64)
DEFINE_SPMM(double, float, spmm_f64x32)
DEFINE_SDDMM(float, sddmm_f32)
DEFINE_SDDMM(double, sddmm_f64)
DEFINE_SOFTMAX_VJP(float, softmax_vjp_f32)
DEFINE_SOFTMAX_VJP(double, softmax_vjp_f64)
DEFINE_SOFTMAX_SHARES(float, softmax_shares_f32)
DEFINE_SOFTMAX_SHARES(double, softmax_shares_f64)

/* Row i's share of a softmax aggregate over a source feature, to be merged online (one
   pass over the row's entries after its max): mx[i, h] = max of sc[e, h] (-inf for a row
   without entries; a NaN wins), s[i, h] = sum exp(sc - mx) and acc[i, h, :] = sum exp(sc -
   mx) x[cols[e], h, :], the exponentials and sums in double (x read as it is; shifted by 0
   where mx is -inf, a row whose scores are all masked: its sums 0). */
#define DEFINE_SOFTMAX_PARTIAL(T, NAME)                                               \
  static void *NAME##_rows(void *arg) {                                               \
    Job *job = (Job *)arg;                                                            \
    const T *x = (const T *)job->x, *sc = (const T *)job->sc;                         \
    T *mx = (T *)job->ds;                                                             \
    double *s = job->sums, *acc = (double *)job->out;                                 \
    const int64_t H = job->H, D = job->D, row = H * D, ld = job->ld;                  \
    double *w = (double *)malloc(sizeof(double) * (H > 0 ? H : 1));                  \
    if (!w) return 0; /* the rows go to the other threads */                          \
    EACH_ROW(i, &job->next, job->m) {                                                \
      const int64_t lo = at(job->ptr, job->index64, i);                               \
      const int64_t hi = at(job->ptr, job->index64, i + 1);                           \
      T *m = mx + i * H;                                                              \
      double *si = s + i * H, *o = acc + i * row;                                     \
      for (int64_t h = 0; h < H; h++) { m[h] = (T)-INFINITY; si[h] = 0; }             \
      for (int64_t k = 0; k < row; k++) o[k] = 0;                                     \
      for (int64_t e = lo; e < hi; e++)                                               \
        for (int64_t h = 0; h < H; h++) {                                             \
          const T v = sc[e * H + h];                                                  \
          if (v > m[h] || (v != v && m[h] == m[h])) m[h] = v;                         \
        }                                                                             \
      for (int64_t e = lo; e < hi; e++) {                                             \
        const T *xr = x + at(job->cols, job->index64, e) * ld;                        \
        if (e + AHEAD < hi)                                                           \
          __builtin_prefetch(x + at(job->cols, job->index64, e + AHEAD) * ld);        \
        for (int64_t h = 0; h < H; h++) {                                             \
          /* shifted by 0 where every score is -inf (masked): weights 0, not NaN */   \
          w[h] = exp((double)sc[e * H + h] - (m[h] == -INFINITY ? 0.0 : (double)m[h])); \
          si[h] += w[h];                                                              \
        }                                                                             \
        for (int64_t h = 0; h < H; h++) {                                             \
          const double wh = w[h];                                                     \
          double *oh = o + h * D;                                                     \
          const T *xh = xr + h * D;                                                   \
          for (int64_t f = 0; f < D; f++) oh[f] += wh * (double)xh[f];                \
        }                                                                             \
      }                                                                               \
    }                                                                                 \
    free(w);                                                                          \
    return 0;                                                                         \
  }

DEFINE_SOFTMAX_PARTIAL(float, softmax_partial_f32)
DEFINE_SOFTMAX_PARTIAL(double, softmax_partial_f64)

/* extremum and select_sum: one feature row of D numbers per node (or entry) */
typedef struct {
  const void *ptr, *cols;
  int index64;
  const void *x, *y, *s;        /* extremum: x; select_sum: x, y, s */
  void *out, *count;            /* extremum: y, cnt; select_sum: out */
  int64_t m, D;
  int64_t next;
} Pick;

/* Row i's extremum of C numbers at `off`, a running best and count per number in
   registers, branch-free (each step a compare and a blend: vectorized); a NaN is noted
   apart and wins at the end, attained by none. */
#define EXTREMUM_CHUNK(T, C, BEATS, INIT)                                              \
  {                                                                                   \
    T b[C], c[C], nan[C];                                                             \
    for (int f = 0; f < C; f++) { b[f] = (T)(INIT); c[f] = 0; nan[f] = 0; }          \
    for (int64_t e = lo; e < hi; e++) {                                               \
      const T *xr = x + (job->cols ? at(job->cols, job->index64, e) : e) * D + off;   \
      if (job->cols && e + AHEAD < hi)                                                \
        __builtin_prefetch(x + at(job->cols, job->index64, e + AHEAD) * D + off);     \
      for (int f = 0; f < C; f++) {                                                   \
        const T v = xr[f], bf = b[f], cf = c[f];                                      \
        const T tied = v == bf ? cf + (T)1 : cf;                                      \
        c[f] = v BEATS bf ? (T)1 : tied;                                              \
        b[f] = v BEATS bf ? v : bf;                                                   \
        nan[f] = v != v ? (T)1 : nan[f];                                              \
      }                                                                               \
    }                                                                                 \
    for (int f = 0; f < C; f++) {                                                     \
      y[i * D + off + f] = nan[f] != 0 ? (T)NAN : hi > lo ? b[f] : (T)0;              \
      cnt[i * D + off + f] = nan[f] != 0 ? (T)0 : c[f];                               \
    }                                                                                 \
    off += C;                                                                         \
  }

#define DEFINE_EXTREMUM(T, NAME, BEATS, INIT)                                         \
  static void *NAME##_rows(void *arg) {                                               \
    Pick *job = (Pick *)arg;                                                          \
    const T *x = (const T *)job->x;                                                   \
    T *y = (T *)job->out, *cnt = (T *)job->count;                                     \
    const int64_t D = job->D;                                                         \
    EACH_ROW(i, &job->next, job->m) {                                                \
      const int64_t lo = at(job->ptr, job->index64, i);                               \
      const int64_t hi = at(job->ptr, job->index64, i + 1);                           \
      int64_t off = 0;                                                                \
      while (D - off >= 64) EXTREMUM_CHUNK(T, 64, BEATS, INIT)                        \
      while (D - off >= 16) EXTREMUM_CHUNK(T, 16, BEATS, INIT)                        \
      while (D - off >= 1) EXTREMUM_CHUNK(T, 1, BEATS, INIT)                          \
    }                                                                                 \
    return 0;                                                                         \
  }

#define SELECT_CHUNK(T, C)                                                            \
  {                                                                                   \
    T acc[C];                                                                         \
    const T *xr = x + u * D + off;                                                    \
    for (int f = 0; f < C; f++) acc[f] = 0;                                           \
    for (int64_t k = lo; k < hi; k++) {                                               \
      const int64_t c = at(job->cols, job->index64, k);                               \
      const T *yr = y + c * D + off, *sr = s + c * D + off;                           \
      if (k + AHEAD < hi) {                                                           \
        const int64_t ahead = at(job->cols, job->index64, k + AHEAD) * D + off;       \
        __builtin_prefetch(y + ahead);                                                \
        __builtin_prefetch(s + ahead);                                                \
      }                                                                               \
      for (int f = 0; f < C; f++) {                                                   \
        const T sv = sr[f];                                                           \
        acc[f] += xr[f] == yr[f] ? sv : (T)0;                                         \
      }                                                                               \
    }                                                                                 \
    for (int f = 0; f < C; f++) out[u * D + off + f] = acc[f];                        \
    off += C;                                                                         \
  }

#define DEFINE_SELECT_SUM(T, NAME)                                                    \
  static void *NAME##_rows(void *arg) {                                               \
    Pick *job = (Pick *)arg;                                                          \
    const T *x = (const T *)job->x, *y = (const T *)job->y, *s = (const T *)job->s;   \
    T *out = (T *)job->out;                                                           \
    const int64_t D = job->D;                                                         \
    EACH_ROW(u, &job->next, job->m) {                                                \
      const int64_t lo = at(job->ptr, job->index64, u);                               \
      const int64_t hi = at(job->ptr, job->index64, u + 1);                           \
      int64_t off = 0;                                                                \
      while (D - off >= 64) SELECT_CHUNK(T, 64)                                       \
      while (D - off >= 16) SELECT_CHUNK(T, 16)                                       \
      while (D - off >= 1) SELECT_CHUNK(T, 1)                                         \
    }                                                                                 \
    return 0;                                                                         \
  }

DEFINE_EXTREMUM(float, max_f32, >, -INFINITY)
DEFINE_EXTREMUM(double, max_f64, >, -INFINITY)
DEFINE_EXTREMUM(float, min_f32, <, INFINITY)
DEFINE_EXTREMUM(double, min_f64, <, INFINITY)
DEFINE_SELECT_SUM(float, select_sum_f32)
DEFINE_SELECT_SUM(double, select_sum_f64)

/* Run `rows` on `threads` threads (this one included; as many as start). */
static int run(void *(*rows)(void *), void *job, int threads) {
  pthread_t ids[256];
  int started = 0;
  if (threads > 256) threads = 256;
  for (int t = 1; t < threads; t++) {
    if (pthread_create(&ids[started], 0, rows, job) != 0) break;
    started++;
  }
  rows(job);
  for (int t = 0; t < started; t++) pthread_join(ids[t], 0);
  return 0;
}

int sarc_spmm(const void *ptr, const void *cols, int index64, const void *w,
              const int64_t *widx, const void *rs, const void *cs, const void *x, int64_t ldx,
              void *out, int64_t m, int64_t H, int64_t D, int prec, int threads) {
  Job job = {ptr, cols, index64, w, x, 0, widx, rs, cs, out, m, H, D, ldx, 0, 0};
  /* prec 0: float; 1: double; 2: double weights, sums and result over a float x */
  return run(prec == 2 ? spmm_f64x32_rows : prec ? spmm_f64_rows : spmm_f32_rows, &job, threads);
}

int sarc_sddmm(const void *ptr, const void *cols, int index64, const void *a, int64_t lda,
               const void *b, void *out, int64_t m, int64_t H, int64_t D, int is64, int threads) {
  Job job = {ptr, cols, index64, 0, b, a, 0, 0, 0, out, m, H, D, lda, 0, 0};
  return run(is64 ? sddmm_f64_rows : sddmm_f32_rows, &job, threads);
}

int sarc_softmax_vjp(const void *ptr, const void *cols, int index64, const void *a, int64_t lda,
                     const void *b, void *p, int64_t m, int64_t H, int64_t D, int64_t widest,
                     int is64, int threads) {
  Job job = {ptr, cols, index64, 0, b, a, 0, 0, 0, p, m, H, D, lda, 0, widest};
  run(is64 ? softmax_vjp_f64_rows : softmax_vjp_f32_rows, &job, threads);
  return job.next >= m ? 0 : -1;   /* rows left: no thread had its scratch */
}

int sarc_softmax_shares(const void *ptr, const void *cols, int index64, const void *a,
                        int64_t lda, const void *b, const void *sc, const void *mx,
                        const double *s, const double *dd, void *alpha, void *ds, int64_t m,
                        int64_t H, int64_t D, int is64, int threads) {
  Job job = {ptr, cols, index64, 0, b, a, 0, 0, 0, alpha, m, H, D, lda, 0, 0, sc, mx, s, dd, ds};
  return run(is64 ? softmax_shares_f64_rows : softmax_shares_f32_rows, &job, threads);
}

int sarc_softmax_partial(const void *ptr, const void *cols, int index64, const void *sc,
                         const void *x, int64_t ldx, void *mx, double *s, double *acc,
                         int64_t m, int64_t H, int64_t D, int is64, int threads) {
  Job job = {ptr, cols, index64, 0, x, 0, 0, 0, 0, acc, m, H, D, ldx, 0, 0, sc, 0, 0, 0, mx, s};
  run(is64 ? softmax_partial_f64_rows : softmax_partial_f32_rows, &job, threads);
  return job.next >= m ? 0 : -1;   /* rows left: no thread had its scratch */
}

int sarc_extremum(const void *ptr, const void *cols, int index64, const void *x, void *y,
                  void *count, int64_t m, int64_t D, int is_max, int is64, int threads) {
  Pick job = {ptr, cols, index64, x, 0, 0, y, count, m, D, 0};
  void *(*rows)(void *) = is_max ? (is64 ? max_f64_rows : max_f32_rows)
                                 : (is64 ? min_f64_rows : min_f32_rows);
  return run(rows, &job, threads);
}

int sarc_select_sum(const void *ptr, const void *cols, int index64, const void *x,
                    const void *y, const void *s, void *out, int64_t m, int64_t D, int is64,
                    int threads) {
  Pick job = {ptr, cols, index64, x, y, s, out, 0, m, D, 0};
  return run(is64 ? select_sum_f64_rows : select_sum_f32_rows, &job, threads);
}

/* scatter_rows: out[idx[e], :] += x[e, :] for every row e of x, in the order of e. Threads
   take 32 numbers of every row at a time (all of them where rows are narrower), so each
   number of out is one thread's: no atomics, the same sums whatever the threads. */
typedef struct {
  const void *idx;
  int index64;
  const void *x;
  void *out;
  int64_t num, D, next;
} Scatter;

#define SCATTER_COLS 32
#define DEFINE_SCATTER_ROWS(T, NAME)                                                  \
  static void *NAME##_cols(void *arg) {                                               \
    Scatter *job = (Scatter *)arg;                                                    \
    const T *x = (const T *)job->x;                                                   \
    T *out = (T *)job->out;                                                           \
    const int64_t D = job->D;                                                         \
    for (int64_t f0 = __atomic_fetch_add(&job->next, SCATTER_COLS, __ATOMIC_RELAXED);  \
         f0 < D; f0 = __atomic_fetch_add(&job->next, SCATTER_COLS, __ATOMIC_RELAXED)) { \
      const int64_t f1 = f0 + SCATTER_COLS < D ? f0 + SCATTER_COLS : D;               \
      for (int64_t e = 0; e < job->num; e++) {                                        \
        T *o = out + at(job->idx, job->index64, e) * D;                               \
        const T *xr = x + e * D;                                                      \
        for (int64_t f = f0; f < f1; f++) o[f] += xr[f];                              \
      }                                                                               \
    }                                                                                 \
    return 0;                                                                         \
  }

DEFINE_SCATTER_ROWS(float, scatter_rows_f32)
DEFINE_SCATTER_ROWS(double, scatter_rows_f64)

int sarc_scatter_rows(const void *idx, int index64, const void *x, void *out, int64_t num,
                      int64_t D, int is64, int threads) {
  Scatter job = {idx, index64, x, out, num, D, 0};
  return run(is64 ? scatter_rows_f64_cols : scatter_rows_f32_cols, &job, threads);
}

/* transpose: the entries of a matrix ordered by column, stably (a counting sort): given
   each entry's column cols[e] and row rows[e] in row order, fill colptr (the running
   count of entries per column, num_cols + 1), and rows_t[k] and order[k] (the entry)
   for the k-th entry in column order. O(E + num_cols), one thread. */
void sarc_transpose(const int64_t *cols, const int64_t *rows, int64_t num, int64_t *colptr,
                    int64_t num_cols, int64_t *next, int64_t *rows_t, int64_t *order) {
  for (int64_t c = 0; c <= num_cols; c++) colptr[c] = 0;
  for (int64_t e = 0; e < num; e++) colptr[cols[e] + 1]++;
  for (int64_t c = 0; c < num_cols; c++) colptr[c + 1] += colptr[c];
  for (int64_t c = 0; c < num_cols; c++) next[c] = colptr[c];
  for (int64_t e = 0; e < num; e++) {
    const int64_t k = next[cols[e]]++;
    rows_t[k] = rows[e];
    order[k] = e;
  }
}

/* Neighbour sampling without replacement (sarc/sampling/neighbours.py defines it): for
   each destination r, of in-degree d = rowptr[row]..rowptr[row+1], keep every in-edge
   if d <= fanout (those of positive weight, with weights), else
   - without weights, Floyd's uniform subset: for J = d - fanout .. d - 1, t = floor(u_J
     (J + 1)); keep rank t unless kept already, then rank J (fanout draws, whatever d);
   - with weights w, the fanout edges of largest key log(u_rank) / w, ties to the lower
     rank (Efraimidis and Spirakis: every edge drawn);
   written at out[slot[r]..] in edge order, count[r] of them. u_i is the key (seed, epoch,
   layer, orig id, tag, i) hashed by splitmix64 as sarc.sampling.draws does. */
#define GOLDEN 0x9E3779B97F4A7C15ULL
static inline uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

typedef struct {
  const int64_t *rowptr, *rows, *orig, *slot;
  const double *weight;
  int64_t n, fanout, seed, epoch, layer, tag;
  int64_t *out, *count;
  int64_t next;
} Draw;

/* a kept edge: its key and rank; "better" = larger key, then lower rank */
typedef struct { double key; int64_t rank; } Kept;
static inline int worse(Kept a, Kept b) { return a.key < b.key || (a.key == b.key && a.rank > b.rank); }

static void sift_down(Kept *h, int64_t k, int64_t i) {   /* min-heap by "worse" */
  for (;;) {
    int64_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < k && worse(h[l], h[m])) m = l;
    if (r < k && worse(h[r], h[m])) m = r;
    if (m == i) return;
    Kept t = h[i]; h[i] = h[m]; h[m] = t; i = m;
  }
}

static int by_rank(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

static inline double uniform_at(uint64_t h, int64_t i) {
  return ((double)(mix((h + GOLDEN) ^ (uint64_t)i) >> 11) + 0.5) * 0x1p-53;
}

/* Floyd's k ranks of 0..d-1 (k < d) into ranks[0..k), with set: an open-addressing table
   of cap (a power of two >= 2k) slots, all -1 */
#define SLOT(t, cap) ((int64_t)(((uint64_t)(t) * GOLDEN) >> 32) & ((cap) - 1))
static void floyd(uint64_t h, int64_t d, int64_t k, int64_t *ranks, int64_t *set, int64_t cap) {
  for (int64_t J = d - k, n = 0; J < d; J++, n++) {
    int64_t t = (int64_t)(uniform_at(h, J) * (double)(J + 1));
    if (t > J) t = J;
    int64_t slot = SLOT(t, cap);
    while (set[slot] >= 0 && set[slot] != t) slot = (slot + 1) & (cap - 1);
    if (set[slot] == t) {               /* kept already: J, which no draw has reached */
      t = J;
      slot = SLOT(t, cap);
      while (set[slot] >= 0) slot = (slot + 1) & (cap - 1);
    }
    set[slot] = t;
    ranks[n] = t;
  }
  for (int64_t c = 0; c < cap; c++) set[c] = -1;   /* empty again: O(k) */
}

static void *draw_rows(void *arg) {
  Draw *job = (Draw *)arg;
  const int64_t k = job->fanout;
  Kept *heap = (Kept *)malloc(sizeof(Kept) * (k > 0 ? k : 1));
  int64_t *ranks = (int64_t *)malloc(sizeof(int64_t) * (k > 0 ? k : 1));
  int64_t cap = 2;
  while (cap < 2 * k) cap *= 2;
  int64_t *set = (int64_t *)malloc(sizeof(int64_t) * cap);
  for (int64_t c = 0; c < cap; c++) set[c] = -1;
  EACH_ROW(r, &job->next, job->n) {
    const int64_t lo = job->rowptr[job->rows[r]], d = job->rowptr[job->rows[r] + 1] - lo;
    int64_t *out = job->out + job->slot[r], got = 0;
    if (d <= k) {
      for (int64_t i = 0; i < d; i++)
        if (!job->weight || job->weight[lo + i] > 0) out[got++] = lo + i;
      job->count[r] = got;
      continue;
    }
    if (k == 0) {
      job->count[r] = 0;
      continue;
    }
    uint64_t h = 0;
    const int64_t fields[5] = {job->seed, job->epoch, job->layer, job->orig[r], job->tag};
    for (int f = 0; f < 5; f++) h = mix((h + GOLDEN) ^ (uint64_t)fields[f]);
    int64_t size = 0;
    if (!job->weight) {
      floyd(h, d, k, ranks, set, cap);
      size = k;
    } else for (int64_t i = 0; i < d; i++) {
      const double w = job->weight[lo + i];
      if (!(w > 0)) continue;             /* weight 0: never drawn */
      Kept c = {log(uniform_at(h, i)) / w, i};
      if (size < k) {                     /* fill, then keep a min-heap of the best k */
        heap[size++] = c;
        if (size == k)
          for (int64_t j = k / 2 - 1; j >= 0; j--) sift_down(heap, k, j);
      } else if (worse(heap[0], c)) {
        heap[0] = c;
        sift_down(heap, k, 0);
      }
    }
    if (job->weight)
      for (int64_t j = 0; j < size; j++) ranks[j] = heap[j].rank;
    qsort(ranks, size, sizeof(int64_t), by_rank);
    for (int64_t j = 0; j < size; j++) out[j] = lo + ranks[j];
    job->count[r] = size;
  }
  free(heap);
  free(ranks);
  free(set);
  return 0;
}

int sarc_sample(const int64_t *rowptr, const int64_t *rows, const int64_t *orig, int64_t n,
                int64_t fanout, int64_t seed, int64_t epoch, int64_t layer, int64_t tag,
                const double *weight, const int64_t *slot, int64_t *out, int64_t *count,
                int threads) {
  Draw job = {rowptr, rows, orig, slot, weight, n, fanout, seed, epoch, layer, tag, out, count, 0};
  return run(draw_rows, &job, threads);
}
