/* A decoding step's products, y (rows, out) = x (rows, in) W^T (+ bias), for the few rows a
   decoding batch has (up to tens), on weights packed once per batch into panels of 16 output
   columns.

   A step's products read every weight once and do little arithmetic per weight read: at 16 rows
   and fewer their limit is the memory's rate, at 32 the arithmetic's. Each thread here takes
   whole pairs of panels, so each weight is read by one thread only, straight through (a panel is
   one contiguous stream of `in` x 16 floats); for each group of up to 8 rows a pair's 32 columns
   are summed in 16 vector registers, each weight vector read once for the group and each x read
   once per weight pair (16 multiply-adds to two loads of the weights and eight of x).

   Layout (float32):
     panels  (ceil(out / 16), in, 16): panel p holds W[16 p + j][k] at p * in * 16 + k * 16 + j,
             zero beyond `out` (`pack_panels`)
     x       rows at x + r * ldx, each `in` contiguous
     y       (rows, out), contiguous
     bias    (out,) or NULL */

/* Without AVX-512 (16 registers of 8 floats) or without GCC 12's or clang's vector types the kernel
   is not built (nothing past the error is compiled, so the build's log names it), and the step
   keeps oneDNN's products. */
#include <string.h>

#include "vector_math.h"

#if !defined(__AVX512F__)
#error "the thin products are written for AVX-512's 32 vector registers; this CPU has no AVX-512"
#elif !defined(LANES)
#error "the thin products need GCC 12 or clang for their vector types"
#else

#define PANEL 16L
/* Weight lines asked for this many steps of k ahead of their use (a step reads one 64-byte line of each
   panel): on the 2-core Zen 5 EPYC, SmolLM2's step products at 16 rows 21.8-21.9 ms with 48 or 128
   against 23.9 with 16 (benchmarks/thin_products_ab.py). */
#define AHEAD 48
/* Rows summed together: their 2 x ROWS sums and the two weight vectors fit AVX-512's 32 vector
   registers of 16 floats. */
#define ROWS 8

/* W (out, in), rows at w + n * ldw, into panels (above). */
void pack_panels(const float *w, long ldw, long out, long in, float *panels, int threads) {
    long count = (out + PANEL - 1) / PANEL;
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (long p = 0; p < count; p++) {
        float *dst = panels + p * in * PANEL;
        for (long k = 0; k < in; k++)
            for (long j = 0; j < PANEL; j++) {
                long n = p * PANEL + j;
                dst[k * PANEL + j] = n < out ? w[n * ldw + k] : 0.f;
            }
    }
}

/* Up to ROWS rows (`rows`, a constant where inlined) against panels a and b: y's columns
   [n0, n0 + width), width at most 32. */
static inline __attribute__((always_inline)) void rows_by_pair(
        const float *restrict x, long ldx, const int rows, const float *restrict a, const float *restrict b,
        long in, const float *restrict bias, float *restrict y, long ldy, long n0, long width) {
    lanes left[ROWS], right[ROWS];
    for (int r = 0; r < rows; r++) left[r] = right[r] = (lanes){0};
    for (long k = 0; k < in; k++) {
        __builtin_prefetch(a + (k + AHEAD) * PANEL);  /* past a panel's end: the next one's start */
        __builtin_prefetch(b + (k + AHEAD) * PANEL);
        lanes wa = load_lanes(a + k * PANEL), wb = load_lanes(b + k * PANEL);
        for (int r = 0; r < rows; r++) {
            float xv = x[r * ldx + k];
            left[r] += xv * wa;
            right[r] += xv * wb;
        }
    }
    for (int r = 0; r < rows; r++) {
        float sums[2 * PANEL];
        __builtin_memcpy(sums, &left[r], sizeof left[r]);
        __builtin_memcpy(sums + PANEL, &right[r], sizeof right[r]);
        float *out = y + r * ldy + n0;
        if (bias)
            for (long j = 0; j < width; j++) out[j] = sums[j] + bias[n0 + j];
        else
            memcpy(out, sums, (size_t)width * sizeof(float));
    }
}

void thin_product(const float *x, long ldx, long rows, long in, const float *panels, long out,
                  const float *bias, float *y, int threads) {
    long count = (out + PANEL - 1) / PANEL, pairs = (count + 1) / 2;
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (long q = 0; q < pairs; q++) {
        long p = 2 * q, n0 = p * PANEL;
        const float *a = panels + p * in * PANEL;
        const float *b = p + 1 < count ? a + in * PANEL : a;  /* an odd last panel: summed twice, written once */
        long width = out - n0 < 2 * PANEL ? out - n0 : 2 * PANEL;
        for (long r0 = 0; r0 < rows; r0 += ROWS) {
            const float *xr = x + r0 * ldx;
            float *yr = y + r0 * out;
            switch (rows - r0 < ROWS ? (int)(rows - r0) : ROWS) {
#define ROWS_CASE(c) case c: rows_by_pair(xr, ldx, c, a, b, in, bias, yr, out, n0, width); break;
                ROWS_CASE(1) ROWS_CASE(2) ROWS_CASE(3) ROWS_CASE(4) ROWS_CASE(5) ROWS_CASE(6) ROWS_CASE(7)
                ROWS_CASE(8)
#undef ROWS_CASE
            }
        }
    }
}

#endif
