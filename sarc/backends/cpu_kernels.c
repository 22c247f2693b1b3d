/* The CPU sparse kernels of sarc's torch backend (sarc/backends/cpu_kernels.py).

   A CSR matrix of m rows: row i's entries are ptr[i] .. ptr[i+1]-1, entry e in column
   cols[e]. Dense operands are row-major [rows, H, D]: H heads of D numbers.

   spmm:  out[i, h, :] = sum over the entries e of row i of  w[e, h] * x[cols[e], h, :]
          (w NULL: weight 1)
   sddmm: out[e, h]    = < a[i, h, :], b[cols[e], h, :] >  for each entry e of row i

   Rows are dealt to `threads` POSIX threads in chunks of 32 by an atomic counter (a
   power-law graph's rows differ in length by orders of magnitude). A row's sums are
   accumulated in registers over chunks of 64 / 32 / 16 numbers of D and written once;
   the next entries' source rows are prefetched. Entries are added in CSR order, so the
   result does not depend on the number of threads. */
#include <pthread.h>
#include <stdint.h>

#define ROWS_PER_GRAB 32
#define AHEAD 4

typedef struct {
  const void *ptr, *cols;
  int index64;                  /* ptr and cols are int64 (else int32) */
  const void *w, *x, *a;        /* spmm: w (or NULL), x; sddmm: a, x is b */
  void *out;
  int64_t m, H, D;
  int64_t next;                 /* the next row to hand out */
} Job;

static inline int64_t at(const void *p, int index64, int64_t i) {
  return index64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}

static int64_t grab(Job *job) {
  return __atomic_fetch_add(&job->next, ROWS_PER_GRAB, __ATOMIC_RELAXED);
}

#define SPMM_CHUNK(T, C)                                                              \
  {                                                                                   \
    T acc[C];                                                                         \
    for (int f = 0; f < C; f++) acc[f] = 0;                                           \
    for (int64_t e = lo; e < hi; e++) {                                               \
      const T *xr = x + at(job->cols, job->index64, e) * row + off;                   \
      if (e + AHEAD < hi)                                                             \
        __builtin_prefetch(x + at(job->cols, job->index64, e + AHEAD) * row + off);   \
      const T v = w ? w[e * H + h] : (T)1;                                            \
      for (int f = 0; f < C; f++) acc[f] += v * xr[f];                                \
    }                                                                                 \
    for (int f = 0; f < C; f++) o[off + f] = acc[f];                                  \
    off += C;                                                                         \
  }

#define DEFINE_SPMM(T, NAME)                                                          \
  static void *NAME##_rows(void *arg) {                                               \
    Job *job = (Job *)arg;                                                            \
    const T *x = (const T *)job->x, *w = (const T *)job->w;                           \
    const int64_t H = job->H, D = job->D, row = H * D;                                \
    for (int64_t i0 = grab(job); i0 < job->m; i0 = grab(job)) {                       \
      const int64_t i1 = i0 + ROWS_PER_GRAB < job->m ? i0 + ROWS_PER_GRAB : job->m;   \
      for (int64_t i = i0; i < i1; i++) {                                             \
        const int64_t lo = at(job->ptr, job->index64, i);                             \
        const int64_t hi = at(job->ptr, job->index64, i + 1);                         \
        T *o = (T *)job->out + i * row;                                               \
        for (int64_t h = 0; h < H; h++) {                                             \
          int64_t off = h * D;                                                        \
          const int64_t end = off + D;                                                \
          while (end - off >= 64) SPMM_CHUNK(T, 64)                                   \
          while (end - off >= 16) SPMM_CHUNK(T, 16)                                   \
          while (end - off >= 1) SPMM_CHUNK(T, 1)                                     \
        }                                                                             \
      }                                                                               \
    }                                                                                 \
    return 0;                                                                         \
  }

#define DEFINE_SDDMM(T, NAME)                                                         \
  static void *NAME##_rows(void *arg) {                                               \
    Job *job = (Job *)arg;                                                            \
    const T *a = (const T *)job->a, *b = (const T *)job->x;                           \
    T *out = (T *)job->out;                                                           \
    const int64_t H = job->H, D = job->D, row = H * D;                                \
    for (int64_t i0 = grab(job); i0 < job->m; i0 = grab(job)) {                       \
      const int64_t i1 = i0 + ROWS_PER_GRAB < job->m ? i0 + ROWS_PER_GRAB : job->m;   \
      for (int64_t i = i0; i < i1; i++) {                                             \
        const int64_t lo = at(job->ptr, job->index64, i);                             \
        const int64_t hi = at(job->ptr, job->index64, i + 1);                         \
        const T *ar = a + i * row;                                                    \
        for (int64_t e = lo; e < hi; e++) {                                           \
          const T *br = b + at(job->cols, job->index64, e) * row;                     \
          if (e + AHEAD < hi)                                                         \
            __builtin_prefetch(b + at(job->cols, job->index64, e + AHEAD) * row);     \
          for (int64_t h = 0; h < H; h++) {                                           \
            T s = 0;                                                                  \
            for (int64_t f = 0; f < D; f++) s += ar[h * D + f] * br[h * D + f];       \
            out[e * H + h] = s;                                                       \
          }                                                                           \
        }                                                                             \
      }                                                                               \
    }                                                                                 \
    return 0;                                                                         \
  }

DEFINE_SPMM(float, spmm_f32)
DEFINE_SPMM(double, spmm_f64)
DEFINE_SDDMM(float, sddmm_f32)
DEFINE_SDDMM(double, sddmm_f64)

/* Run `rows` on `threads` threads (this one included); 0, or -1 if no thread started. */
static int run(void *(*rows)(void *), Job *job, int threads) {
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

int sarc_spmm(const void *ptr, const void *cols, int index64, const void *w, const void *x,
              void *out, int64_t m, int64_t H, int64_t D, int is64, int threads) {
  Job job = {ptr, cols, index64, w, x, 0, out, m, H, D, 0};
  return run(is64 ? spmm_f64_rows : spmm_f32_rows, &job, threads);
}

int sarc_sddmm(const void *ptr, const void *cols, int index64, const void *a, const void *b,
               void *out, int64_t m, int64_t H, int64_t D, int is64, int threads) {
  Job job = {ptr, cols, index64, 0, b, a, out, m, H, D, 0};
  return run(is64 ? sddmm_f64_rows : sddmm_f32_rows, &job, threads);
}
