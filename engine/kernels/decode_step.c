/* The element-wise work of a decoding step between its matrix products, one pass each over rows
   that are still in cache.

   Eager torch runs each of these as several operators over a batch of tens of rows (an RMSNorm is
   six: square, mean, add, rsqrt and two products; the rotary pass a roll, a product and a fused
   multiply-add over strided views; SwiGLU's silu and product over half of the joined gate/up
   rows), each a library call with its own OpenMP region and a fresh output: at a 3.5M model's
   shapes (64 rows of 256) an RMSNorm took 76 us, a tenth of its step's time beside the products.
   Compiled by `build.py` with the host's vector instructions and torch's OpenMP runtime.

   All tensors float32, rows contiguous (`decode_step.py` checks the layouts). Small batches run on
   the calling thread: below PARALLEL_FROM elements a team of threads costs more than it saves. */

#include <math.h>

#include "vector_math.h"

#define PARALLEL_FROM 32768L

/* h += delta (skipped for a NULL delta), then out = h / sqrt(mean(h^2) + eps) * weight, for each
   of `rows` rows of `width`: the residual sum and the next RMSNorm, as transformers' LlamaRMSNorm
   computes it in float32. */
void add_rms_norm(float *restrict h, const float *restrict delta, float *restrict out,
                  const float *restrict weight, long rows, long width, float eps, int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static) if (rows * width >= PARALLEL_FROM)
    for (long r = 0; r < rows; r++) {
        float *restrict hr = h + r * width;
        float *restrict o = out + r * width;
        float sum = 0.f;
        if (delta) {
            const float *restrict d = delta + r * width;
            #pragma omp simd reduction(+:sum)
            for (long j = 0; j < width; j++) {
                float v = hr[j] + d[j];
                hr[j] = v;
                sum += v * v;
            }
        } else {
            #pragma omp simd reduction(+:sum)
            for (long j = 0; j < width; j++) sum += hr[j] * hr[j];
        }
        float inverse = 1.f / sqrtf(sum / (float)width + eps);
        #pragma omp simd
        for (long j = 0; j < width; j++) o[j] = hr[j] * inverse * weight[j];
    }
}

/* The rotary pass in place over the first `heads` heads of each row of x (row r at x + r * row):
   x * cos + rotate_half(x) * sin at row r's position, with `signed_sin` holding -sin in each head's
   first half (so rotate_half becomes a swap of halves). The tables are (capacity, head_dim).
   Returns 1 (row left as it was) where a position lies outside [0, capacity), else 0. */
int rotary(float *restrict x, long rows, long row, int heads, int head_dim, const float *restrict cos,
           const float *restrict signed_sin, const long *restrict positions, long capacity, int threads) {
    int failed = 0, half = head_dim / 2;
    #pragma omp parallel for num_threads(threads) schedule(static) reduction(|:failed) \
        if (rows * heads * head_dim >= PARALLEL_FROM)
    for (long r = 0; r < rows; r++) {
        long p = positions[r];
        if (p < 0 || p >= capacity) {
            failed |= 1;
            continue;
        }
        const float *restrict c = cos + p * head_dim;
        const float *restrict s = signed_sin + p * head_dim;
        for (int h = 0; h < heads; h++) {
            float *restrict a = x + r * row + (long)h * head_dim, *restrict b = a + half;
            #pragma omp simd
            for (int i = 0; i < half; i++) {
                float ai = a[i], bi = b[i];
                a[i] = ai * c[i] + bi * s[i];
                b[i] = bi * c[i + half] + ai * s[i + half];
            }
        }
    }
    return failed;
}

/* SwiGLU's product: out (rows, inter) = silu(gate) * up, from the joined gate/up projection's
   rows (rows, 2 inter), gate the first half of each. */
void silu_mul(const float *restrict gate_up, float *restrict out, long rows, long inter, int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static) if (rows * inter >= PARALLEL_FROM)
    for (long r = 0; r < rows; r++) {
        const float *restrict g = gate_up + r * 2 * inter, *restrict u = g + inter;
        float *restrict o = out + r * inter;
        #pragma omp simd
        for (long j = 0; j < inter; j++) o[j] = silu(g[j]) * u[j];
    }
}
