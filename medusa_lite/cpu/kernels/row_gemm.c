/* Few-row float32 GEMM for tree verification on CPU: y[R, N] = x[R, K] @ w[N, K]^T.
 *
 * Verifying a candidate tree multiplies every weight matrix by a handful of rows (one per node).
 * Decoding is memory-bound: what costs is streaming the weights, so a product with a few rows
 * should cost about what a one-row product costs. General GEMM kernels (MKL's, packed or not) do
 * not get there for R = 4-8 on a 2-core CPU (about 1.7x a one-row product); this kernel does, by
 * reading each weight once per call in the order it is stored, with a software prefetch far
 * enough ahead to keep memory busy while the FMAs run.
 *
 * One source, two instruction sets, chosen by the compiler flags (medusa_lite/kernels/__init__.py
 * builds each variant into its own library and picks one at run time from the CPU's features):
 *   -mavx512f -mfma  16-float zmm vectors, 3 per block row (48 outputs), 8 rows per pass
 *                    (24 accumulators of the 32 zmm registers);
 *   -mavx2 -mfma     8-float ymm vectors, 2 per block row (16 outputs), 6 rows per pass
 *                    (12 accumulators + 2 weights + 1 broadcast of the 16 ymm registers).
 *
 * Weights are packed once (row_gemm_pack) into column blocks of BLOCK_COLS outputs:
 * packed[b][k][j] = w[b * BLOCK_COLS + j][k], zero for columns past N. One call streams every
 * block once: up to MAX_ROWS rows straight from memory, more rows MAX_ROWS at a time from the
 * block while it is in L2 cache.
 *
 * row_gemm_bf16 reads a packed copy held in bfloat16 (the float32 packing rounded to nearest even,
 * done by the caller): half the bytes to stream, each value widened to float32 exactly as it is
 * loaded (a bfloat16 is the high half of a float32), products and sums in float32. For a small
 * model read again and again within one decoding step (a drafter: one forward per drafted depth)
 * half the bytes is what keeps its weights in the last-level cache between those forwards.
 */
#include <immintrin.h>

#if defined(__AVX512F__) && defined(__FMA__)
typedef __m512 vec;
#define LANES 16
#define VECTORS 3
#define MAX_ROWS 8
#define vec_zero() _mm512_setzero_ps()
#define vec_load(p) _mm512_loadu_ps(p)
/* LANES bfloat16 values (uint16) widened to float32: shifted into the high half of each lane */
#define vec_load_bf16(p) \
  _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define vec_broadcast(v) _mm512_set1_ps(v)
#define vec_fmadd(a, b, c) _mm512_fmadd_ps(a, b, c)
#define vec_store(p, v) _mm512_storeu_ps(p, v)
/* the first `count` (< LANES) floats of v */
#define vec_store_first(p, v, count) _mm512_mask_storeu_ps(p, (__mmask16)((1u << (count)) - 1), v)
#elif defined(__AVX2__) && defined(__FMA__)
typedef __m256 vec;
#define LANES 8
#define VECTORS 2
#define MAX_ROWS 6
#define vec_zero() _mm256_setzero_ps()
#define vec_load(p) _mm256_loadu_ps(p)
#define vec_load_bf16(p) \
  _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define vec_broadcast(v) _mm256_set1_ps(v)
#define vec_fmadd(a, b, c) _mm256_fmadd_ps(a, b, c)
#define vec_store(p, v) _mm256_storeu_ps(p, v)
#define vec_store_first(p, v, count) \
  _mm256_maskstore_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(count)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)), v)
#else
#error "row_gemm.c needs -mavx512f -mfma or -mavx2 -mfma"
#endif

#define BLOCK_COLS (LANES * VECTORS)
#define PREFETCH_BYTES 3072             /* how far ahead of the current block row to prefetch */
#define CACHE_LINE 64

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

static inline void store_row(float *y, long n0, long N, const vec *acc) {
  for (int v = 0; v < VECTORS; v++) {
    long n = n0 + LANES * v;
    if (n + LANES <= N)
      vec_store(y + n, acc[v]);
    else if (n < N)
      vec_store_first(y + n, acc[v], N - n);
  }
}

/* One column block b of the packed weight (element type WEIGHT, widened to float32 by LOAD) times
 * R rows of x. */
#define BLOCK_KERNEL(NAME, WEIGHT, LOAD, R)                                                      \
  static void NAME##_rows_##R(const float *x, const WEIGHT *packed, float *y, long b, long N, long K) { \
    vec acc[R][VECTORS];                                                                         \
    for (int r = 0; r < R; r++)                                                                  \
      for (int v = 0; v < VECTORS; v++) acc[r][v] = vec_zero();                                  \
    const WEIGHT *p = packed + b * K * BLOCK_COLS;                                               \
    for (long k = 0; k < K; k++) {                                                               \
      const WEIGHT *q = p + k * BLOCK_COLS;                                                      \
      const char *ahead = (const char *)q + PREFETCH_BYTES;                                      \
      for (int line = 0; line < (int)(BLOCK_COLS * sizeof(WEIGHT)); line += CACHE_LINE)          \
        _mm_prefetch(ahead + line, _MM_HINT_T0);                                                 \
      vec w[VECTORS];                                                                            \
      for (int v = 0; v < VECTORS; v++) w[v] = LOAD(q + LANES * v);                              \
      for (int r = 0; r < R; r++) {                                                              \
        vec xr = vec_broadcast(x[r * K + k]);                                                    \
        for (int v = 0; v < VECTORS; v++) acc[r][v] = vec_fmadd(w[v], xr, acc[r][v]);            \
      }                                                                                          \
    }                                                                                            \
    for (int r = 0; r < R; r++) store_row(y + r * N, b * BLOCK_COLS, N, acc[r]);                 \
  }

/* Rows r0.. of one column block, MAX_ROWS at a time: the block's weights come from memory for the
 * first group and are still in L2 cache (K * BLOCK_COLS values) for the next. */
#define ALL_ROWS_KERNEL(NAME, WEIGHT)                                                            \
  static void NAME##_all_rows(const float *x, const WEIGHT *packed, float *y, long b, long R, long N, long K) { \
    for (long r0 = 0; r0 < R; r0 += MAX_ROWS) {                                                  \
      const float *xr = x + r0 * K;                                                              \
      float *yr = y + r0 * N;                                                                    \
      switch (R - r0 < MAX_ROWS ? R - r0 : MAX_ROWS) {                                           \
        case 1: NAME##_rows_1(xr, packed, yr, b, N, K); break;                                   \
        case 2: NAME##_rows_2(xr, packed, yr, b, N, K); break;                                   \
        case 3: NAME##_rows_3(xr, packed, yr, b, N, K); break;                                   \
        case 4: NAME##_rows_4(xr, packed, yr, b, N, K); break;                                   \
        case 5: NAME##_rows_5(xr, packed, yr, b, N, K); break;                                   \
        case 6: NAME##_rows_6(xr, packed, yr, b, N, K); break;                                   \
        MORE_ROWS_CASES(NAME)                                                                    \
      }                                                                                          \
    }                                                                                            \
  }

#if MAX_ROWS > 6
#define MORE_ROWS_KERNELS(NAME, WEIGHT, LOAD) BLOCK_KERNEL(NAME, WEIGHT, LOAD, 7) BLOCK_KERNEL(NAME, WEIGHT, LOAD, 8)
#define MORE_ROWS_CASES(NAME)                      \
  case 7: NAME##_rows_7(xr, packed, yr, b, N, K); break; \
  case 8: NAME##_rows_8(xr, packed, yr, b, N, K); break;
#else
#define MORE_ROWS_KERNELS(NAME, WEIGHT, LOAD)
#define MORE_ROWS_CASES(NAME)
#endif

#define KERNELS(NAME, WEIGHT, LOAD)                                                               \
  BLOCK_KERNEL(NAME, WEIGHT, LOAD, 1)                                                            \
  BLOCK_KERNEL(NAME, WEIGHT, LOAD, 2)                                                            \
  BLOCK_KERNEL(NAME, WEIGHT, LOAD, 3)                                                            \
  BLOCK_KERNEL(NAME, WEIGHT, LOAD, 4)                                                            \
  BLOCK_KERNEL(NAME, WEIGHT, LOAD, 5)                                                            \
  BLOCK_KERNEL(NAME, WEIGHT, LOAD, 6)                                                            \
  MORE_ROWS_KERNELS(NAME, WEIGHT, LOAD)                                                          \
  ALL_ROWS_KERNEL(NAME, WEIGHT)

KERNELS(f32, float, vec_load)
KERNELS(bf16, unsigned short, vec_load_bf16)

/* x: [R, K] row-major, y: [R, N] row-major, packed: from row_gemm_pack; threads: OpenMP threads
 * (passed by the caller, torch.get_num_threads(), in case this library's OpenMP runtime is not
 * the one PyTorch set). Every weight block is read from memory once, whatever R. */
void row_gemm(const float *x, const float *packed, float *y, long R, long N, long K, int threads) {
  long blocks = (N + BLOCK_COLS - 1) / BLOCK_COLS;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (long b = 0; b < blocks; b++) f32_all_rows(x, packed, y, b, R, N, K);
}

/* row_gemm with a bfloat16 packed copy (the float32 packing's layout, each value rounded). */
void row_gemm_bf16(const float *x, const unsigned short *packed, float *y, long R, long N, long K, int threads) {
  long blocks = (N + BLOCK_COLS - 1) / BLOCK_COLS;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (long b = 0; b < blocks; b++) bf16_all_rows(x, packed, y, b, R, N, K);
}
