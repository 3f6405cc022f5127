/* One decoding step's attention for every row and key-value head in one pass over the KV cache.

   Eager torch runs it as two batched products and a softmax: one small product per row and head,
   each a library call, reading the keys at about half the memory's rate, and the scores written
   out and read back between the three kernels. Here each (row, head) pair reads its keys once
   (all of its `group` query heads' scores from each key), takes the softmax while the scores are
   in cache, and reads its values once. Compiled by `build.py` with the host's vector instructions
   and OpenMP (torch's own runtime: the pairs are shared by torch's threads).

   Layout (float32, as `decode_cache.RowCache` holds them):
     q     (rows, kv_heads, group, head_dim); row r at q + r * q_row, the rest contiguous
     keys, values  (rows, kv_heads, capacity, head_dim) buffers; columns [0, end) are read
     mask  (rows, 1, 1, capacity): 0 where attended, -inf at a prompt's left padding
     out   (rows, kv_heads, group, head_dim), contiguous
   The column of the step's own token is always attended, so no row's softmax is empty. */

#include <math.h>
#include <stdlib.h>

/* exp(x) for x <= 0 (a score minus its row's largest): 2^n * p(r) with r = x - n ln 2 in
   [-ln2/2, ln2/2] and p the degree-7 series of Cephes' expf (relative error about 1e-7), written
   so that the compiler vectorizes it; below -87 the result is at most 1.6e-38. */
static inline float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x;
    float n = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { int i; float f; } two_n;
    two_n.i = ((int)n + 127) << 23;
    return p * two_n.f;
}

/* One (row, head) pair: scores (group x end) into `scratch`, then each query head's softmax and its
   values' weighted sum into `acc` (group x head_dim, also in `scratch`). Inlined with head_dim a
   constant for the common widths, so that the inner loops unroll into vector registers. */
static inline __attribute__((always_inline)) void attend_pair(
        const float *restrict q, const float *restrict keys, const float *restrict values,
        const float *restrict mask, float *restrict out, int group, const int head_dim, int end,
        float scale, float *restrict scratch) {
    float *scores = scratch, *acc = scratch + (long)group * end;
    for (int j = 0; j < end; j++) {
        const float *key = keys + (long)j * head_dim;
        for (int g = 0; g < group; g++) {
            const float *qg = q + g * head_dim;
            float dot = 0.f;
            #pragma omp simd reduction(+:dot)
            for (int d = 0; d < head_dim; d++) dot += qg[d] * key[d];
            scores[(long)g * end + j] = dot * scale + mask[j];
        }
    }
    for (int g = 0; g < group; g++) {
        float *s = scores + (long)g * end, *a = acc + g * head_dim;
        float top = -INFINITY;
        #pragma omp simd reduction(max:top)
        for (int j = 0; j < end; j++) top = s[j] > top ? s[j] : top;
        float total = 0.f;
        #pragma omp simd reduction(+:total)
        for (int j = 0; j < end; j++) {
            float e = mask[j] == -INFINITY ? 0.f : exp_nonpositive(s[j] - top);
            s[j] = e;
            total += e;
        }
        for (int d = 0; d < head_dim; d++) a[d] = 0.f;
        for (int j = 0; j < end; j++) {
            const float *value = values + (long)j * head_dim;
            float p = s[j];
            #pragma omp simd
            for (int d = 0; d < head_dim; d++) a[d] += p * value[d];
        }
        float inverse = 1.f / total;
        float *o = out + g * head_dim;
        for (int d = 0; d < head_dim; d++) o[d] = a[d] * inverse;
    }
}

/* Returns 0, or 1 when a thread's scratch could not be allocated (nothing is then trusted). */
int decode_attention(const float *q, long q_row, const float *keys, const float *values, long cache_row,
                     long cache_head, const float *mask, long mask_row, float *out, int rows,
                     int kv_heads, int group, int head_dim, int end, float scale, int threads) {
    int failed = 0;
    #pragma omp parallel num_threads(threads) reduction(|:failed)
    {
        float *scratch = malloc(sizeof(float) * ((size_t)group * end + (size_t)group * head_dim));
        failed = scratch == NULL;
        #pragma omp for collapse(2) schedule(static)
        for (int r = 0; r < rows; r++) {
            for (int h = 0; h < kv_heads; h++) {
                if (scratch == NULL) continue;
                const float *qh = q + r * q_row + (long)h * group * head_dim;
                const float *k = keys + r * cache_row + h * cache_head;
                const float *v = values + r * cache_row + h * cache_head;
                const float *m = mask + r * mask_row;
                float *o = out + ((long)r * kv_heads + h) * group * head_dim;
                switch (head_dim) {
                    case 32: attend_pair(qh, k, v, m, o, group, 32, end, scale, scratch); break;
                    case 64: attend_pair(qh, k, v, m, o, group, 64, end, scale, scratch); break;
                    case 128: attend_pair(qh, k, v, m, o, group, 128, end, scale, scratch); break;
                    default: attend_pair(qh, k, v, m, o, group, head_dim, end, scale, scratch);
                }
            }
        }
        free(scratch);
    }
    return failed;
}
