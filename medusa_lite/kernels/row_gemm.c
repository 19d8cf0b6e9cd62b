/* Few-row float32 GEMM for tree verification on CPU: y[R, N] = x[R, K] @ w[N, K]^T.
 *
 * Verifying a candidate tree multiplies every weight matrix by a handful of rows (one per node).
 * Decoding is memory-bound: what costs is streaming the weights, so a product with R <= 8 rows
 * should cost about what a one-row product costs. General GEMM kernels (MKL's, packed or not) do
 * not get there for R = 4-8 on a 2-core AVX-512 CPU (about 1.7x a one-row product); this kernel
 * does, by reading each weight once per call in the order it is stored, with a software prefetch
 * far enough ahead to keep memory busy while the FMAs run.
 *
 * Weights are packed once (pack_weight) into column blocks of BLOCK_COLS outputs:
 * packed[b][k][j] = w[b * BLOCK_COLS + j][k], zero for columns past N. One call streams every
 * block once: up to MAX_ROWS rows straight from memory, more rows MAX_ROWS at a time from the
 * block while it is in L2 cache.
 * Built by medusa_lite/kernels/__init__.py with: cc -O3 -mavx512f -mfma -fopenmp -shared -fPIC
 */
#include <immintrin.h>

#define VECTORS 3                       /* zmm registers of outputs per block row */
#define BLOCK_COLS (16 * VECTORS)       /* 48 outputs per block */
#define MAX_ROWS 8                      /* 8 rows x 3 accumulators = 24 of the 32 zmm registers */
#define PREFETCH_AHEAD 16               /* block rows (of BLOCK_COLS floats) prefetched ahead: 3 KiB */

long row_gemm_block_cols(void) { return BLOCK_COLS; }
long row_gemm_max_rows(void) { return MAX_ROWS; }

/* packed must hold ceil(N / BLOCK_COLS) * K * BLOCK_COLS floats. */
void row_gemm_pack(const float *w, float *packed, long N, long K, int threads) {
  long blocks = (N + BLOCK_COLS - 1) / BLOCK_COLS;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (long b = 0; b < blocks; b++)
    for (long k = 0; k < K; k++)
      for (long j = 0; j < BLOCK_COLS; j++) {
        long n = b * BLOCK_COLS + j;
        packed[(b * K + k) * BLOCK_COLS + j] = n < N ? w[n * K + k] : 0.0f;
      }
}

static inline void store_row(float *y, long n0, long N, const __m512 *acc) {
  for (int v = 0; v < VECTORS; v++) {
    long n = n0 + 16 * v;
    if (n + 16 <= N)
      _mm512_storeu_ps(y + n, acc[v]);
    else if (n < N)
      _mm512_mask_storeu_ps(y + n, (__mmask16)((1u << (N - n)) - 1), acc[v]);
  }
}

#define BLOCK_KERNEL(R)                                                                          \
  static void block_rows_##R(const float *x, const float *packed, float *y, long b, long N, long K) { \
    __m512 acc[R][VECTORS];                                                                      \
    for (int r = 0; r < R; r++)                                                                  \
      for (int v = 0; v < VECTORS; v++) acc[r][v] = _mm512_setzero_ps();                         \
    const float *p = packed + b * K * BLOCK_COLS;                                                \
    for (long k = 0; k < K; k++) {                                                               \
      const float *q = p + k * BLOCK_COLS;                                                       \
      const char *ahead = (const char *)(q + PREFETCH_AHEAD * BLOCK_COLS);                       \
      _mm_prefetch(ahead, _MM_HINT_T0);                                                          \
      _mm_prefetch(ahead + 64, _MM_HINT_T0);                                                     \
      _mm_prefetch(ahead + 128, _MM_HINT_T0);                                                    \
      __m512 w0 = _mm512_loadu_ps(q), w1 = _mm512_loadu_ps(q + 16), w2 = _mm512_loadu_ps(q + 32); \
      for (int r = 0; r < R; r++) {                                                              \
        __m512 xr = _mm512_set1_ps(x[r * K + k]);                                                \
        acc[r][0] = _mm512_fmadd_ps(w0, xr, acc[r][0]);                                          \
        acc[r][1] = _mm512_fmadd_ps(w1, xr, acc[r][1]);                                          \
        acc[r][2] = _mm512_fmadd_ps(w2, xr, acc[r][2]);                                          \
      }                                                                                          \
    }                                                                                            \
    for (int r = 0; r < R; r++) store_row(y + r * N, b * BLOCK_COLS, N, acc[r]);                 \
  }

BLOCK_KERNEL(1)
BLOCK_KERNEL(2)
BLOCK_KERNEL(3)
BLOCK_KERNEL(4)
BLOCK_KERNEL(5)
BLOCK_KERNEL(6)
BLOCK_KERNEL(7)
BLOCK_KERNEL(8)

/* Rows r0.. of one column block, MAX_ROWS at a time: the block's weights come from memory for the
 * first group and are still in L2 cache (K * BLOCK_COLS floats: 110-295 KiB here) for the next. */
static void block_all_rows(const float *x, const float *packed, float *y, long b, long R, long N, long K) {
  for (long r0 = 0; r0 < R; r0 += MAX_ROWS) {
    const float *xr = x + r0 * K;
    float *yr = y + r0 * N;
    switch (R - r0 < MAX_ROWS ? R - r0 : MAX_ROWS) {
      case 1: block_rows_1(xr, packed, yr, b, N, K); break;
      case 2: block_rows_2(xr, packed, yr, b, N, K); break;
      case 3: block_rows_3(xr, packed, yr, b, N, K); break;
      case 4: block_rows_4(xr, packed, yr, b, N, K); break;
      case 5: block_rows_5(xr, packed, yr, b, N, K); break;
      case 6: block_rows_6(xr, packed, yr, b, N, K); break;
      case 7: block_rows_7(xr, packed, yr, b, N, K); break;
      case 8: block_rows_8(xr, packed, yr, b, N, K); break;
    }
  }
}

/* x: [R, K] row-major, y: [R, N] row-major, packed: from row_gemm_pack; threads: OpenMP threads
 * (passed by the caller, torch.get_num_threads(), in case this library's OpenMP runtime is not
 * the one PyTorch set). Every weight block is read from memory once, whatever R. */
void row_gemm(const float *x, const float *packed, float *y, long R, long N, long K, int threads) {
  long blocks = (N + BLOCK_COLS - 1) / BLOCK_COLS;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (long b = 0; b < blocks; b++) block_all_rows(x, packed, y, b, R, N, K);
}
