/* One decoding step's attention for every row and key-value head in one pass over the KV cache.

   Eager torch runs it as batched products and a softmax: one small product per row and head, each a
   library call, reading the keys at about half the memory's rate, and the scores written out and
   read back between the kernels. Here each (row, head) pair reads its keys once (all of its `group`
   query heads' scores from each key), takes the softmax while the scores are in cache, and reads
   its values once. Compiled by `build.py` with the host's vector instructions and OpenMP (torch's
   own runtime: the pairs are shared by torch's threads).

   Layout (float32, as the caches of `decode_cache.py` hold them):
     q     (rows, kv_heads, group, head_dim); row r at q + r * q_row, the rest contiguous
     keys, values  (rows, kv_heads, capacity, head_dim) buffers, row r at r * cache_row, head h at
           h * cache_head, each head's columns contiguous
     mask  (rows, 1, 1, capacity): 0 where attended, -inf at a prompt's left padding
     out   (rows, kv_heads, group, head_dim), contiguous
   `decode_attention` reads columns [0, end) of each row's buffers (`RowCache`: the prompt repeated
   to each sample's row); `decode_attention_shared` reads the columns every prompt begins with
   (held once for all rows, where the prompts share a prefix), row r's prompt's (held once for its
   samples, with their own mask) and then [0, own) of its own buffers (`SharedPromptCache`).
   The column of the step's own token is always attended, so no row's softmax is empty. */

#include <math.h>
#include <stdlib.h>

#include "vector_math.h"

/* The head's width is what the vector loops below run over (`lanes`, vector_math.h). Left to
vectorize plain loops, GCC 12 vectorized a score's loop over the query heads of a group instead
(three of them with SmolLM2's heads: sixteen-wide vectors mostly masked, every product over the
head's width scalar): SmolLM2's attention took 6.2 ms of a 40 ms decoding step at 32 rows, 4.2 ms
in vectors of the width (2-core AVX-512 EPYC, 2026-12-07). */
#ifdef LANES
#define IN_LANES(head_dim) ((head_dim) % LANES == 0 && (head_dim) <= 8 * LANES)
#else
#define IN_LANES(head_dim) 0
#endif

/* One (row, head) pair over its columns, which lie in two parts: `shared` columns of keys and
values its prompt's other samples read too (the prompt's, held once; `shared_mask` masks their
padding) and `own` columns of its own. Scores (group x columns) go to `scratch`, then each query
head's softmax over both parts and its values' weighted sum into `acc` (group x head_dim, also in
`scratch`). Inlined with head_dim a constant for the common widths, so that the inner loops unroll
into vector registers: with a width of whole `lanes`, a column's key is read into registers once for
the group's query heads, and each score is that many products and one sum of lanes. */
static inline __attribute__((always_inline)) void score_part(
        const float *restrict q, const float *restrict keys, const float *restrict mask, float *restrict scores,
        int group, const int head_dim, int columns, int stride, float scale) {
#ifdef LANES
    if (IN_LANES(head_dim)) {
        const int chunks = head_dim / LANES;
        for (int j = 0; j < columns; j++) {
            const float *key = keys + (long)j * head_dim;
            lanes k[8];
            for (int c = 0; c < chunks; c++) k[c] = load_lanes(key + c * LANES);
            float bias = mask ? mask[j] : 0.f;
            for (int g = 0; g < group; g++) {
                const float *qg = q + g * head_dim;
                lanes dot = load_lanes(qg) * k[0];
                for (int c = 1; c < chunks; c++) dot += load_lanes(qg + c * LANES) * k[c];
                scores[(long)g * stride + j] = lane_sum(dot) * scale + bias;
            }
        }
        return;
    }
#endif
    for (int j = 0; j < columns; j++) {
        const float *key = keys + (long)j * head_dim;
        for (int g = 0; g < group; g++) {
            const float *qg = q + g * head_dim;
            float dot = 0.f;
            #pragma omp simd reduction(+:dot)
            for (int d = 0; d < head_dim; d++) dot += qg[d] * key[d];
            scores[(long)g * stride + j] = dot * scale + (mask ? mask[j] : 0.f);
        }
    }
}

/* acc += the values' sum weighted by p. With a width of whole `lanes`, the sum is kept in registers
over the columns, two columns at a time into two sums (each addition waits on the one before it in
its own sum only). */
static inline __attribute__((always_inline)) void weigh_part(
        const float *restrict p, const float *restrict values, float *restrict acc, const int head_dim, int columns) {
#ifdef LANES
    if (IN_LANES(head_dim)) {
        const int chunks = head_dim / LANES;
        lanes even[8], odd[8];
        for (int c = 0; c < chunks; c++) even[c] = odd[c] = (lanes){0};
        int j = 0;
        for (; j + 1 < columns; j += 2) {
            const float *first = values + (long)j * head_dim, *second = first + head_dim;
            for (int c = 0; c < chunks; c++) {
                even[c] += p[j] * load_lanes(first + c * LANES);
                odd[c] += p[j + 1] * load_lanes(second + c * LANES);
            }
        }
        if (j < columns)
            for (int c = 0; c < chunks; c++) even[c] += p[j] * load_lanes(values + (long)j * head_dim + c * LANES);
        for (int c = 0; c < chunks; c++)
            store_lanes(acc + c * LANES, load_lanes(acc + c * LANES) + even[c] + odd[c]);
        return;
    }
#endif
    for (int j = 0; j < columns; j++) {
        const float *value = values + (long)j * head_dim;
        float w = p[j];
        #pragma omp simd
        for (int d = 0; d < head_dim; d++) acc[d] += w * value[d];
    }
}

static inline __attribute__((always_inline)) void attend_pair(
        const float *restrict q, const float *restrict prefix_keys, const float *restrict prefix_values, int prefix,
        const float *restrict shared_keys, const float *restrict shared_values,
        const float *restrict shared_mask, int shared, const float *restrict keys, const float *restrict values,
        const float *restrict mask, int own, float *restrict out, int group, const int head_dim, float scale,
        float *restrict scratch) {
    int end = prefix + shared + own;
    float *scores = scratch, *acc = scratch + (long)group * end;
    score_part(q, prefix_keys, NULL, scores, group, head_dim, prefix, end, scale);
    score_part(q, shared_keys, shared_mask, scores + prefix, group, head_dim, shared, end, scale);
    score_part(q, keys, mask, scores + prefix + shared, group, head_dim, own, end, scale);
    for (int g = 0; g < group; g++) {
        float *s = scores + (long)g * end, *a = acc + g * head_dim;
        float top = -INFINITY;
        #pragma omp simd reduction(max:top)
        for (int j = 0; j < end; j++) top = s[j] > top ? s[j] : top;
        float total = 0.f;
        #pragma omp simd reduction(+:total)
        for (int j = 0; j < end; j++) {
            float e = s[j] == -INFINITY ? 0.f : exp_nonpositive(s[j] - top);
            s[j] = e;
            total += e;
        }
        for (int d = 0; d < head_dim; d++) a[d] = 0.f;
        weigh_part(s, prefix_values, a, head_dim, prefix);
        weigh_part(s + prefix, shared_values, a, head_dim, shared);
        weigh_part(s + prefix + shared, values, a, head_dim, own);
        float inverse = 1.f / total;
        float *o = out + g * head_dim;
        for (int d = 0; d < head_dim; d++) o[d] = a[d] * inverse;
    }
}

#define DISPATCH_WIDTH(call_with_width) \
    switch (head_dim) { \
        case 32: call_with_width(32); break; \
        case 64: call_with_width(64); break; \
        case 128: call_with_width(128); break; \
        default: call_with_width(head_dim); \
    }

/* Each row's attention to the `prefix_width` columns every prompt begins with (held once for all
   rows: head h at prefix_keys + h * prefix_head; none when prefix_width is 0), then to its prompt's
   rest, held once for all its samples (prompt `prompt_of[r]`, `prompt_width` columns, its padding in
   `prompt_mask`), then to its own tokens' columns [0, own) (a `SharedPromptCache`), one softmax over
   the three. With `new_keys` (rows,
   kv_heads, head_dim; row r at r * new_row, its heads contiguous) each pair first writes this
   step's key and value into column `append_at` of its own buffers (the cache's append, done where
   the pair reads them next). Returns 0; 1 added when a thread's scratch could not be allocated, 2
   where a row names a prompt outside [0, prompts) (that row is not computed). A NULL `prompt_of`
   gives row r prompt r (`decode_attention`). */
int decode_attention_shared(const float *q, long q_row, const float *prefix_keys, const float *prefix_values,
                            long prefix_head, int prefix_width, const float *prompt_keys, const float *prompt_values,
                            long prompt_row, long prompt_head, const float *prompt_mask, long prompt_mask_row,
                            const long *prompt_of, int prompts, int prompt_width, float *keys,
                            float *values, long cache_row, long cache_head, int own, const float *new_keys,
                            const float *new_values, long new_row, long append_at, float *out, int rows,
                            int kv_heads, int group, int head_dim, float scale, int threads) {
    int failed = 0, end = prefix_width + prompt_width + own;
    #pragma omp parallel num_threads(threads) reduction(|:failed)
    {
        float *scratch = malloc(sizeof(float) * ((size_t)group * end + (size_t)group * head_dim));
        failed = scratch == NULL;
        #pragma omp for collapse(2) schedule(static)
        for (int r = 0; r < rows; r++) {
            for (int h = 0; h < kv_heads; h++) {
                long p = prompt_of ? prompt_of[r] : r;
                if (p < 0 || p >= prompts) failed |= 2;
                if (scratch == NULL || p < 0 || p >= prompts) continue;
                const float *qh = q + r * q_row + (long)h * group * head_dim;
                const float *pk = prompt_keys + p * prompt_row + h * prompt_head;
                const float *pv = prompt_values + p * prompt_row + h * prompt_head;
                float *k = keys + r * cache_row + h * cache_head;
                float *v = values + r * cache_row + h * cache_head;
                if (new_keys) {  /* this step's key and value into column append_at first */
                    const float *nk = new_keys + r * new_row + (long)h * head_dim;
                    const float *nv = new_values + r * new_row + (long)h * head_dim;
                    for (int d = 0; d < head_dim; d++) {
                        k[append_at * head_dim + d] = nk[d];
                        v[append_at * head_dim + d] = nv[d];
                    }
                }
                float *o = out + ((long)r * kv_heads + h) * group * head_dim;
                const float *hk = prefix_width ? prefix_keys + h * prefix_head : NULL;
                const float *hv = prefix_width ? prefix_values + h * prefix_head : NULL;
                #define SHARED(width) attend_pair(qh, hk, hv, prefix_width, pk, pv, prompt_mask + p * prompt_mask_row, \
                                                  prompt_width, k, v, NULL, own, o, group, width, scale, scratch)
                DISPATCH_WIDTH(SHARED)
                #undef SHARED
            }
        }
        free(scratch);
    }
    return failed;
}

/* Every row's attention to its own buffer's columns [0, end) (a `RowCache`: the prompt repeated to
   each sample's row): each row is its own prompt, with no columns after it; this step's key and
   value, when given, go into column end - 1. */
int decode_attention(const float *q, long q_row, float *keys, float *values, long cache_row,
                     long cache_head, const float *mask, long mask_row, const float *new_keys,
                     const float *new_values, long new_row, float *out, int rows, int kv_heads, int group,
                     int head_dim, int end, float scale, int threads) {
    return decode_attention_shared(q, q_row, NULL, NULL, 0, 0, keys, values, cache_row, cache_head, mask, mask_row,
                                   NULL, rows, end,
                                   keys, values, cache_row, cache_head, 0, new_keys, new_values, new_row, end - 1,
                                   out, rows, kv_heads, group, head_dim, scale, threads);
}
