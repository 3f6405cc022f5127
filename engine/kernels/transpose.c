/* A float32 matrix transposed into rows: what a weight gradient's product needs of its output
   gradient (dW = dy^T x: oneDNN reads its first operand in rows, so dy^T is copied first).

   torch copies a transposed view on one thread, a 60 x 60 block at a time, and at an LM head's
   width the source rows lie a multiple of 4 KiB apart (49,152 floats: SmolLM2's vocabulary), so a
   block's rows fall in the same cache sets: the 1,376 x 49,152 gradient of SmolLM2's update took
   55 ms there against 21 here (2 threads, 2-core AVX-512 EPYC; `benchmarks/transpose_ab.py`).
   Here each thread takes 64 x 64 tiles, transposed in registers 16 x 16 (AVX-512) or 8 x 8 (AVX)
   at a time, the tile's edges element by element. A copy: the values are the same bits. */

#include <stddef.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif

#define TILE 64L
#define PARALLEL_FROM 32768L

#if defined(__AVX512F__)
#define BLOCK 16L
/* The 16 x 16 block at s (row stride lds) into d (row stride ldd), transposed: pairs of rows
   interleaved by 1, 2, 4 and 8 floats. */
static inline void block(const float *s, long lds, float *d, long ldd) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(s + i * lds);
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
        __m512d c = _mm512_castps_pd(t[i + 2]), e = _mm512_castps_pd(t[i + 3]);
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, e));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, e));
    }
    for (int i = 0; i < 16; i += 8)
        for (int j = 0; j < 4; j++) {
            t[i + j] = _mm512_shuffle_f32x4(r[i + j], r[i + 4 + j], 0x88);
            t[i + 4 + j] = _mm512_shuffle_f32x4(r[i + j], r[i + 4 + j], 0xdd);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
        r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xdd);
    }
    for (int i = 0; i < 16; i++) _mm512_storeu_ps(d + i * ldd, r[i]);
}
#elif defined(__AVX__)
#define BLOCK 8L
/* The 8 x 8 block at s into d, transposed: rows interleaved by 1 and 2 floats, then halves swapped. */
static inline void block(const float *s, long lds, float *d, long ldd) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(s + i * lds);
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int j = 0; j < 4; j++) {
        t[j] = _mm256_permute2f128_ps(r[j], r[4 + j], 0x20);
        t[4 + j] = _mm256_permute2f128_ps(r[j], r[4 + j], 0x31);
    }
    for (int i = 0; i < 8; i++) _mm256_storeu_ps(d + i * ldd, t[i]);
}
#else
#define BLOCK 1L
static inline void block(const float *s, long lds, float *d, long ldd) {
    (void)lds;
    (void)ldd;
    *d = *s;
}
#endif

/* dst (cols x rows, row stride ldd) = src (rows x cols, row stride lds) transposed. */
void transpose(const float *restrict src, long rows, long cols, long lds, float *restrict dst, long ldd,
               int threads) {
    long tile_rows = (rows + TILE - 1) / TILE, tile_cols = (cols + TILE - 1) / TILE;
    #pragma omp parallel for num_threads(threads) schedule(static) if (rows * cols >= PARALLEL_FROM)
    for (long t = 0; t < tile_rows * tile_cols; t++) {
        long i0 = (t / tile_cols) * TILE, j0 = (t % tile_cols) * TILE;
        long i1 = i0 + TILE < rows ? i0 + TILE : rows, j1 = j0 + TILE < cols ? j0 + TILE : cols;
        long i = i0;
        for (; i + BLOCK <= i1; i += BLOCK) {
            long j = j0;
            for (; j + BLOCK <= j1; j += BLOCK) block(src + i * lds + j, lds, dst + j * ldd + i, ldd);
            for (; j < j1; j++)
                for (long k = i; k < i + BLOCK; k++) dst[j * ldd + k] = src[k * lds + j];
        }
        for (; i < i1; i++)
            for (long j = j0; j < j1; j++) dst[j * ldd + i] = src[i * lds + j];
    }
}
