/* The element-wise work of a Llama-style layer between its matrix products (RMSNorm, the rotary
   pass, SwiGLU's silu-and-product), forward and backward, one pass each over the rows.

   Eager torch runs each of these as several operators (an RMSNorm is six: square, mean, add,
   rsqrt and two products, and its backward about as many again; SwiGLU's silu and product, and a
   backward of five), each a library call with its own OpenMP region and a fresh output:
     - in a decoding step, over tens of rows in cache: at the 3.5M model's shapes (64 rows of 256)
       an RMSNorm took 34 us against 13 here (`decode_step.py`);
     - in a training pass, over thousands of tokens read from memory each time: at the 27.5M
       model's (3,693 tokens of 512, 1,536 wide inside), an RMSNorm's forward and backward took
       11.7 ms against 3.7 here, SwiGLU's 21.8 against 13.7 (`models/fused_layers.py`).
   Compiled by `build.py` with the host's vector instructions and torch's OpenMP runtime.

   All tensors float32, rows contiguous (the Python wrappers check the layouts). Small batches run
   on the calling thread: below PARALLEL_FROM elements a team of threads costs more than it saves. */

#include <math.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "vector_math.h"

#define PARALLEL_FROM 32768L

/* h += delta (skipped for a NULL delta), then out = h / sqrt(mean(h^2) + eps) * weight, for each
   of `rows` rows of `width`, as transformers' LlamaRMSNorm computes it in float32; each row's
   1 / sqrt(...) also into `rstd` unless it is NULL (kept for the backward). */
void add_rms_norm(float *restrict h, const float *restrict delta, float *restrict out,
                  const float *restrict weight, float *restrict rstd, long rows, long width, float eps,
                  int threads) {
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
        if (rstd) rstd[r] = inverse;
        #pragma omp simd
        for (long j = 0; j < width; j++) o[j] = hr[j] * inverse * weight[j];
    }
}

/* RMSNorm's backward from the forward's input x and `rstd` (r): with y = x r w,
   dx = r (dy w) - x r^3 / width * sum(dy w x), and dweight = the sum over rows of dy x r (each
   thread sums its rows into its own row of a scratch, added up at the end). Returns 1 where the
   scratch could not be allocated (nothing written), else 0. */
int rms_norm_backward(const float *restrict dy, const float *restrict x, const float *restrict weight,
                      const float *restrict rstd, float *restrict dx, float *restrict dweight, long rows,
                      long width, int threads) {
    if (rows * width < PARALLEL_FROM) threads = 1;
    float *partial = calloc((size_t)threads * (size_t)width, sizeof(float));
    if (partial == NULL) return 1;
    #pragma omp parallel num_threads(threads)
    {
        int t = 0, team = 1;
#ifdef _OPENMP
        t = omp_get_thread_num();
        team = omp_get_num_threads();
#endif
        float *restrict mine = partial + (long)t * width;
        for (long r = t; r < rows; r += team) {
            const float *restrict g = dy + r * width, *restrict xr = x + r * width;
            float *restrict d = dx + r * width;
            float inverse = rstd[r], dot = 0.f;
            #pragma omp simd reduction(+:dot)
            for (long j = 0; j < width; j++) dot += g[j] * weight[j] * xr[j];
            float scale = dot * inverse * inverse * inverse / (float)width;
            #pragma omp simd
            for (long j = 0; j < width; j++) {
                d[j] = inverse * g[j] * weight[j] - scale * xr[j];
                mine[j] += g[j] * xr[j] * inverse;
            }
        }
    }
    for (long j = 0; j < width; j++) dweight[j] = 0.f;
    for (int t = 0; t < threads; t++) {
        const float *restrict mine = partial + (long)t * width;
        #pragma omp simd
        for (long j = 0; j < width; j++) dweight[j] += mine[j];
    }
    free(partial);
    return 0;
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

/* SwiGLU's product: out (rows, width) = silu(gate) * up, row r of gate at gate + r * stride and of
   up at up + r * stride (the decoding step's joined gate/up rows: up = gate + width, stride 2
   width; a training pass's two tensors: stride width). */
void silu_mul(const float *restrict gate, const float *restrict up, long stride, float *restrict out, long rows,
              long width, int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static) if (rows * width >= PARALLEL_FROM)
    for (long r = 0; r < rows; r++) {
        const float *restrict g = gate + r * stride, *restrict u = up + r * stride;
        float *restrict o = out + r * width;
        #pragma omp simd
        for (long j = 0; j < width; j++) o[j] = silu(g[j]) * u[j];
    }
}

/* silu_mul's backward over n contiguous elements: with s = sigmoid(gate),
   dgate = dout * up * s * (1 + gate * (1 - s)) and dup = dout * silu(gate). */
void silu_mul_backward(const float *restrict dout, const float *restrict gate, const float *restrict up,
                       float *restrict dgate, float *restrict dup, long n, int threads) {
    #pragma omp parallel for simd num_threads(threads) schedule(static) if (n >= PARALLEL_FROM)
    for (long i = 0; i < n; i++) {
        float g = gate[i], s = sigmoid(g);
        dup[i] = dout[i] * g * s;
        dgate[i] = dout[i] * up[i] * s * (1.f + g * (1.f - s));
    }
}
