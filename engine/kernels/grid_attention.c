/* Attention over a packed batch's grids (`engine/training/packed.py`), forward and backward, for the
   scoring passes and the update on a CPU in float32.

   torch's CPU kernel for scaled_dot_product_attention with a mask ran SmolLM2's grids (rows of 47
   queries against 92 keys, heads of 64, three query heads a key-value head) at 20-32 GFLOP/s on a
   2-core EPYC whose matrix products reach 400: its blocks are sized for long sequences, and every
   block is a library call. Here a (row, key-value head) pair is one task: its keys and values are
   laid out once, and each of its query heads' queries go through the scores, the softmax and the
   values in blocks of `BLOCK` query rows, with products written for these shapes (register tiles of
   `TILE` rows by up to four 16-float vectors, `lanes`), and no query row computes scores past the
   last key it attends (a causal grid computes about half its rectangle). The backward recomputes a
   block's probabilities from the scores and the forward's log-sum-exp, as flash attention does.

   Layout (float32; each row's head_dim floats contiguous, the rest strided, as torch holds them):
     q, out, dq     (batch, kv_heads * group, queries, head_dim), strides qs (of batch, head, query);
                    query head h * group + g reads key-value head h; dout, its strides ds
     k, v, dk, dv   (batch, kv_heads, keys, head_dim), strides ks and vs (dk k's, dv v's)
     lse            (batch, kv_heads * group, queries), contiguous: log sum_j exp(scale x q.k_j) over
                    the attended keys
     mask           (batch or 1, 1, queries, keys) bytes, 1 where attended, row b at mask + b * mask_batch
                    (mask_batch 0: one mask for every row), each row's contiguous; NULL with `causal`:
                    query i attends keys 0..i; NULL without: every key.
   A query that attends no key gives zeros (and no gradient). head_dim is a multiple of 16 (the
   wrapper falls back to torch otherwise). Compiled by `build.py`, threads shared with torch's. */

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "vector_math.h"

#ifndef LANES
#error "the grid attention kernel is written in 16-float vectors (GCC >= 12 or clang)"
#endif

#define BLOCK 64 /* query rows of a pair per pass: the scores' scratch is BLOCK x keys */
#define TILE 4   /* rows of a product's register tile */
#define WIDE 4   /* vectors of a tile's row: 64 columns */

static inline int round_up(int n) { return (n + LANES - 1) / LANES * LANES; }

/* c[r][0, chunks x 16) = sum_k<depth a[r][k] b[k][...] for `rows` rows (constants where inlined, so
   that the sums stay in registers). */
static inline __attribute__((always_inline)) void nn_tile(const int rows, const int chunks, int depth,
        const float *restrict a, long lda, const float *restrict b, long ldb, float *restrict c, long ldc) {
    lanes acc[TILE][WIDE];
    for (int r = 0; r < rows; r++)
        for (int x = 0; x < chunks; x++) acc[r][x] = (lanes){0};
    for (int k = 0; k < depth; k++) {
        lanes bk[WIDE];
        for (int x = 0; x < chunks; x++) bk[x] = load_lanes(b + (long)k * ldb + x * LANES);
        for (int r = 0; r < rows; r++) {
            float ar = a[r * lda + k];
            for (int x = 0; x < chunks; x++) acc[r][x] += ar * bk[x];
        }
    }
    for (int r = 0; r < rows; r++)
        for (int x = 0; x < chunks; x++) store_lanes(c + r * ldc + x * LANES, acc[r][x]);
}

/* nn_tile with the vectors of a row a constant: `chunks` of them, columns j on. */
#define NN_CHUNKS(rows, a, c, depth) \
    switch (chunks) { \
        case 4: nn_tile(rows, 4, depth, a, lda, b + j, ldb, c + j, ldc); break; \
        case 3: nn_tile(rows, 3, depth, a, lda, b + j, ldb, c + j, ldc); break; \
        case 2: nn_tile(rows, 2, depth, a, lda, b + j, ldb, c + j, ldc); break; \
        default: nn_tile(rows, 1, depth, a, lda, b + j, ldb, c + j, ldc); \
    }

/* c (m x n) = a (m x depth) b (depth x n), n a multiple of 16. With `ends` (a row's extent: ends[r]
   of row r), a tile computes only the columns its rows reach (`ends_columns` 1, rounded up to whole
   vectors) or sums only the depth they reach (`ends_columns` 0); past them a row's c is not written. */
static void product(int m, int n, int depth, const float *restrict a, long lda, const float *restrict b, long ldb,
                    float *restrict c, long ldc, const int *ends, int ends_columns) {
    for (int r0 = 0; r0 < m; r0 += TILE) {
        int rows = m - r0 < TILE ? m - r0 : TILE, reach = 0;
        if (ends)
            for (int r = 0; r < rows; r++) reach = ends[r0 + r] > reach ? ends[r0 + r] : reach;
        int columns = ends && ends_columns ? round_up(reach) : n;
        int full = ends && !ends_columns ? reach : depth;
        columns = columns < n ? columns : n;
        for (int j = 0; j < columns; j += WIDE * LANES) {
            int chunks = (columns - j) / LANES;
            chunks = chunks < WIDE ? chunks : WIDE;
            const float *ar = a + (long)r0 * lda;
            float *cr = c + (long)r0 * ldc;
            if (rows == TILE) {
                NN_CHUNKS(TILE, ar, cr, full)
            } else {
                for (int r = 0; r < rows; r++) NN_CHUNKS(1, ar + r * lda, cr + r * ldc, full)
            }
        }
    }
}

/* c[j0 + r][x0, x0 + chunks x 16) += sum_m a[m][j0 + r] b[m][...] for `cols` columns r of a, over the
   rows m whose extent reaches past j0 (`ends`: the others' a is zero there). */
static inline __attribute__((always_inline)) void tn_tile(const int cols, const int chunks, int j0, int x0,
        int depth, const float *restrict a, long lda, const float *restrict b, long ldb, float *restrict c,
        long ldc, const int *restrict ends) {
    lanes acc[TILE][WIDE];
    for (int r = 0; r < cols; r++)
        for (int x = 0; x < chunks; x++) acc[r][x] = (lanes){0};
    for (int m = 0; m < depth; m++) {
        if (ends[m] <= j0) continue;
        lanes bm[WIDE];
        for (int x = 0; x < chunks; x++) bm[x] = load_lanes(b + (long)m * ldb + x0 + x * LANES);
        const float *am = a + (long)m * lda + j0;
        for (int r = 0; r < cols; r++)
            for (int x = 0; x < chunks; x++) acc[r][x] += am[r] * bm[x];
    }
    for (int r = 0; r < cols; r++)
        for (int x = 0; x < chunks; x++) {
            float *cx = c + (long)(j0 + r) * ldc + x0 + x * LANES;
            store_lanes(cx, load_lanes(cx) + acc[r][x]);
        }
}

/* tn_tile with the vectors of a row a constant: `chunks` of them, columns x0 on, a's columns j on. */
#define TN_CHUNKS(cols, j) \
    switch (chunks) { \
        case 4: tn_tile(cols, 4, j, x0, depth, a, lda, b, ldb, c, ldc, ends); break; \
        case 3: tn_tile(cols, 3, j, x0, depth, a, lda, b, ldb, c, ldc, ends); break; \
        case 2: tn_tile(cols, 2, j, x0, depth, a, lda, b, ldb, c, ldc, ends); break; \
        default: tn_tile(cols, 1, j, x0, depth, a, lda, b, ldb, c, ldc, ends); \
    }

/* c[j][0, width) += sum_m<depth a[m][j] b[m][0, width) for j < n: a transposed, read down its columns
   (tiles of TILE columns j of a and rows of c, b's rows in vectors), skipping the rows m of a whose
   extent ends[m] stops before the tile. width a multiple of 16. */
static void product_tn(int n, int width, int depth, const float *restrict a, long lda, const float *restrict b,
                       long ldb, float *restrict c, long ldc, const int *restrict ends) {
    for (int j0 = 0; j0 < n; j0 += TILE) {
        for (int x0 = 0; x0 < width; x0 += WIDE * LANES) {
            int chunks = (width - x0) / LANES;
            chunks = chunks < WIDE ? chunks : WIDE;
            if (n - j0 >= TILE) {
                TN_CHUNKS(TILE, j0)
            } else {
                for (int j = j0; j < n; j++) TN_CHUNKS(1, j)
            }
        }
    }
}

/* t (head_dim x padded) = the transpose of rows (keys x head_dim, row j at rows + j * stride), zeros
   in columns keys..padded. */
static void transpose(const float *restrict rows, long stride, int keys, int head_dim, int padded,
                      float *restrict t) {
    for (int d = 0; d < head_dim; d++) {
        float *td = t + (long)d * padded;
        for (int j = 0; j < keys; j++) td[j] = rows[j * stride + d];
        for (int j = keys; j < padded; j++) td[j] = 0.f;
    }
}

/* A pair's scratch, per thread: the keys and values transposed, a block's scores and a second block
   (the backward's), each query's extent (1 + the last key it attends, 0 for none) and its mask as a
   bias (queries x padded: 0 where attended, -inf elsewhere, the padding's columns included). */
typedef struct {
    float *kt, *vt, *s, *ds, *bias;
    int *ends;
    long masked;  /* the grid row the biases and extents are of (-1: none yet) */
} Scratch;

static int scratch_alloc(Scratch *w, int queries, int padded, int head_dim) {
    w->kt = malloc(sizeof(float) * (size_t)head_dim * padded);
    w->vt = malloc(sizeof(float) * (size_t)head_dim * padded);
    w->s = malloc(sizeof(float) * (size_t)BLOCK * padded);
    w->ds = malloc(sizeof(float) * (size_t)BLOCK * padded);
    w->bias = malloc(sizeof(float) * (size_t)queries * padded);
    w->ends = malloc(sizeof(int) * (size_t)queries);
    w->masked = -1;
    return w->kt && w->vt && w->s && w->ds && w->bias && w->ends;
}

static void scratch_free(Scratch *w) {
    free(w->kt); free(w->vt); free(w->s); free(w->ds); free(w->bias); free(w->ends);
}

/* The extents and biases of grid row b's queries, from its mask (or causally, or all keys, the same
   for every row): computed when the thread's previous pair was of another row (a thread's pairs are
   consecutive, a row's key-value heads one after the other). */
static void pair_masks(Scratch *w, long b, const unsigned char *mask, int causal, int queries, int keys,
                       int padded) {
    if (w->masked >= 0 && (w->masked == b || !mask)) return;
    w->masked = b;
    for (int i = 0; i < queries; i++) {
        float *bias = w->bias + (long)i * padded;
        int end = 0;
        for (int j = 0; j < padded; j++) {
            int on = j < keys && (mask ? mask[(long)i * keys + j] : !causal || j <= i);
            bias[j] = on ? 0.f : -INFINITY;
            end = on ? j + 1 : end;
        }
        w->ends[i] = end;
    }
}

/* A query row's probabilities over its scores `s` (padded): p[j] = exp(scale s[j] - lse) at the keys
   its `bias` row attends, zeros elsewhere; with lse NULL, the softmax itself (its log-sum-exp into
   *lse_out). In vectors up to the row's extent `end` (the scores the products computed). */
static void probabilities(float *restrict s, const float *restrict bias, int end, int padded, float scale,
                          const float *lse, float *lse_out) {
    const int chunks = (end + LANES - 1) / LANES;
    lanes most = (lanes){0} - INFINITY;
    for (int c = 0; c < chunks; c++) {
        lanes x = load_lanes(s + c * LANES) * scale + load_lanes(bias + c * LANES);
        store_lanes(s + c * LANES, x);
        if (!lse) most = max_lanes(most, x);  /* the backward has the row's lse */
    }
    float top = lse ? *lse : lane_max(most);
    int none = top == -INFINITY || top == INFINITY;  /* no key attended */
    lanes total = (lanes){0};
    for (int c = 0; c < chunks; c++) {
        lanes x = load_lanes(s + c * LANES);
        lanes e = select_lanes(x == -INFINITY, (lanes){0}, exp_lanes(x - top));
        e = none ? (lanes){0} : e;
        store_lanes(s + c * LANES, e);
        total += e;
    }
    for (int j = chunks * LANES; j < padded; j++) s[j] = 0.f;
    if (!lse) {
        float sum = lane_sum(total), inverse = sum > 0.f ? 1.f / sum : 0.f;
        for (int c = 0; c < chunks; c++) store_lanes(s + c * LANES, load_lanes(s + c * LANES) * inverse);
        if (lse_out) *lse_out = sum > 0.f ? top + logf(sum) : INFINITY;
    }
}

/* One call's tensors and shapes (`grid_attention_forward`'s and `_backward`'s arguments). */
typedef struct {
    const float *q, *k, *v, *out, *lse_in, *dout;
    const long *qs, *ks, *vs, *ds;
    const unsigned char *mask;
    long mask_batch;
    int causal, kv_heads, group, queries, keys, head_dim, padded;
    float scale;
    float *out_w, *lse_w, *dq, *dk, *dv;
} Call;

/* Where pair (b, h)'s query head g begins in q (and out, dq), and its lse row. */
static inline long query_head(const Call *c, int b, int h, int g) {
    return b * c->qs[0] + ((long)h * c->group + g) * c->qs[1];
}

static inline long lse_row(const Call *c, int b, int h, int g) {
    return (((long)b * c->kv_heads + h) * c->group + g) * c->queries;
}

/* Pair (b, h) forward: out, and lse where asked for. */
static void forward_pair(const Call *c, Scratch *w, int b, int h) {
    const int queries = c->queries, keys = c->keys, head_dim = c->head_dim, padded = c->padded;
    const long *qs = c->qs;
    long key_at = b * c->ks[0] + h * c->ks[1], value_at = b * c->vs[0] + h * c->vs[1];
    transpose(c->k + key_at, c->ks[2], keys, head_dim, padded, w->kt);
    pair_masks(w, b, c->mask ? c->mask + b * c->mask_batch : NULL, c->causal, queries, keys, padded);
    for (int g = 0; g < c->group; g++) {
        for (int i0 = 0; i0 < queries; i0 += BLOCK) {
            int rows = queries - i0 < BLOCK ? queries - i0 : BLOCK;
            const int *ends = w->ends + i0;
            long at = query_head(c, b, h, g) + i0 * qs[2];
            product(rows, padded, head_dim, c->q + at, qs[2], w->kt, padded, w->s, padded, ends, 1);
            for (int r = 0; r < rows; r++)
                probabilities(w->s + (long)r * padded, w->bias + (long)(i0 + r) * padded, ends[r], padded, c->scale,
                              NULL, c->lse_w ? c->lse_w + lse_row(c, b, h, g) + i0 + r : NULL);
            product(rows, head_dim, keys, w->s, padded, c->v + value_at, c->vs[2], c->out_w + at, qs[2], ends, 0);
        }
    }
}

/* Pair (b, h) backward: its rows of dq, and its key-value head's dk and dv (only this pair's). */
static void backward_pair(const Call *c, Scratch *w, int b, int h) {
    const int queries = c->queries, keys = c->keys, head_dim = c->head_dim, padded = c->padded;
    const long *qs = c->qs, *ds = c->ds;
    long key_at = b * c->ks[0] + h * c->ks[1], value_at = b * c->vs[0] + h * c->vs[1];
    for (int j = 0; j < keys; j++) {
        memset(c->dk + key_at + j * c->ks[2], 0, sizeof(float) * (size_t)head_dim);
        memset(c->dv + value_at + j * c->vs[2], 0, sizeof(float) * (size_t)head_dim);
    }
    transpose(c->k + key_at, c->ks[2], keys, head_dim, padded, w->kt);
    transpose(c->v + value_at, c->vs[2], keys, head_dim, padded, w->vt);
    pair_masks(w, b, c->mask ? c->mask + b * c->mask_batch : NULL, c->causal, queries, keys, padded);
    for (int g = 0; g < c->group; g++) {
        for (int i0 = 0; i0 < queries; i0 += BLOCK) {
            int rows = queries - i0 < BLOCK ? queries - i0 : BLOCK;
            const int *ends = w->ends + i0;
            long at = query_head(c, b, h, g) + i0 * qs[2];
            const float *dob = c->dout + b * ds[0] + ((long)h * c->group + g) * ds[1] + i0 * ds[2];
            product(rows, padded, head_dim, c->q + at, qs[2], w->kt, padded, w->s, padded, ends, 1);
            product(rows, padded, head_dim, dob, ds[2], w->vt, padded, w->ds, padded, ends, 1);
            for (int r = 0; r < rows; r++) {
                float *p = w->s + (long)r * padded, *dp = w->ds + (long)r * padded;
                probabilities(p, w->bias + (long)(i0 + r) * padded, ends[r], padded, c->scale,
                              c->lse_in + lse_row(c, b, h, g) + i0 + r, NULL);
                const float *o = c->out + at + r * qs[2], *d = dob + r * ds[2];
                lanes dot = (lanes){0};
                for (int x = 0; x < head_dim; x += LANES) dot += load_lanes(o + x) * load_lanes(d + x);
                float delta = lane_sum(dot);
                #pragma omp simd
                for (int j = 0; j < ends[r]; j++) dp[j] = p[j] * (dp[j] - delta) * c->scale;
                for (int j = ends[r]; j < padded; j++) dp[j] = 0.f;
            }
            product(rows, head_dim, keys, w->ds, padded, c->k + key_at, c->ks[2], c->dq + at, qs[2], ends, 0);
            product_tn(keys, head_dim, rows, w->ds, padded, c->q + at, qs[2], c->dk + key_at, c->ks[2], ends);
            product_tn(keys, head_dim, rows, w->s, padded, dob, ds[2], c->dv + value_at, c->vs[2], ends);
        }
    }
}

/* Every (row, key-value head) pair, shared by the threads, each thread with its own scratch.
   Returns 0, 1 where a thread's scratch could not be allocated. */
static int each_pair(const Call *c, int batch, int backward, int threads) {
    int failed = 0;
    #pragma omp parallel num_threads(threads) reduction(|:failed)
    {
        Scratch w;
        failed = !scratch_alloc(&w, c->queries, c->padded, c->head_dim);
        #pragma omp for schedule(static)
        for (int pair = 0; pair < batch * c->kv_heads; pair++) {
            if (failed) continue;
            if (backward)
                backward_pair(c, &w, pair / c->kv_heads, pair % c->kv_heads);
            else
                forward_pair(c, &w, pair / c->kv_heads, pair % c->kv_heads);
        }
        scratch_free(&w);
    }
    return failed;
}

/* out (q's strides), and lse where not NULL (a pass without gradients needs none). Returns as
   `each_pair`. */
int grid_attention_forward(const float *q, const long *qs, const float *k, const long *ks, const float *v,
                           const long *vs, const unsigned char *mask, long mask_batch, int causal, float *out,
                           float *lse, int batch, int kv_heads, int group, int queries, int keys, int head_dim,
                           float scale, int threads) {
    Call c = {.q = q, .k = k, .v = v, .qs = qs, .ks = ks, .vs = vs, .mask = mask, .mask_batch = mask_batch,
              .causal = causal, .kv_heads = kv_heads, .group = group, .queries = queries, .keys = keys,
              .head_dim = head_dim, .padded = round_up(keys), .scale = scale, .out_w = out, .lse_w = lse};
    return each_pair(&c, batch, 0, threads);
}

/* dq (q's strides), dk (k's) and dv (v's) from the forward's out (q's strides) and lse and the
   gradient dout (its strides `ds`) of out. Returns as `each_pair`. */
int grid_attention_backward(const float *q, const long *qs, const float *k, const long *ks, const float *v,
                            const long *vs, const unsigned char *mask, long mask_batch, int causal, const float *out,
                            const float *lse, const float *dout, const long *ds, float *dq, float *dk, float *dv,
                            int batch, int kv_heads, int group, int queries, int keys, int head_dim, float scale,
                            int threads) {
    Call c = {.q = q, .k = k, .v = v, .out = out, .lse_in = lse, .dout = dout, .qs = qs, .ks = ks, .vs = vs,
              .ds = ds, .mask = mask, .mask_batch = mask_batch, .causal = causal, .kv_heads = kv_heads,
              .group = group, .queries = queries, .keys = keys, .head_dim = head_dim, .padded = round_up(keys),
              .scale = scale, .dq = dq, .dk = dk, .dv = dv};
    return each_pair(&c, batch, 1, threads);
}
