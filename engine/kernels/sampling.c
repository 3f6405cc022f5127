/* A decoding step's sampling from its logits, each row in three passes: the token drawn by
   inverting the cumulative distribution of softmax(x / T) at one uniform number per row, its
   log-probability, and the row's entropy.

   Eager torch runs it as log_softmax, exp, a product and a sum for the entropy, a cumulative sum
   and a search: six passes over the (rows, vocabulary) logits and three tensors of their size; at
   SmolLM2's 49,152 tokens and 32 rows, a fifteenth of a step on a 2-core CPU. Here, per row:
     1. m = the largest logit;
     2. s = sum_j e_j with e_j = exp(z_j - m), z = x / T, and sum_j e_j (z_j - m), both in double;
     3. the first j whose running sum of e_j (in double) reaches (1 - u) s: the token drawn, as
        `UniformDraws.sample` draws it from probabilities that need not sum to 1.
   log p(token) = z_token - m - log s, and the entropy -sum_j p_j log p_j = log s - sum_j e_j (z_j - m) / s.
   The exponentials are `exp_nonpositive`'s (about 1e-7 relative): a row whose draw lands within
   that of a boundary between two tokens may draw the other one. */

#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "vector_math.h"

#define SPAN 64L /* the third pass adds a span at a time, then looks inside the one that reaches */

static inline float scaled_exp(float x, float inverse_t, float m) {
    return x == -INFINITY ? 0.f : exp_nonpositive(x * inverse_t - m);
}

/* logits (rows x vocab, row stride ld), u (rows) in [0, 1); writes token (rows), log_prob (rows),
   entropy (rows). */
void sample_rows(const float *restrict logits, long rows, long vocab, long ld, float inverse_t,
                 const float *restrict u, long *restrict token, float *restrict log_prob,
                 float *restrict entropy, int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static) if (rows > 1)
    for (long r = 0; r < rows; r++) {
        const float *restrict x = logits + r * ld;
        float m = -INFINITY;
        #pragma omp simd reduction(max:m)
        for (long j = 0; j < vocab; j++) m = x[j] > m ? x[j] : m;
        m *= inverse_t;
        double s = 0.0, moment = 0.0;
        #pragma omp simd reduction(+:s, moment)
        for (long j = 0; j < vocab; j++) {
            float e = scaled_exp(x[j], inverse_t, m);
            s += e;
            moment += e == 0.f ? 0.0 : (double)e * (double)(x[j] * inverse_t - m);
        }
        double target = (1.0 - (double)u[r]) * s, running = 0.0;
        long chosen = -1;
        for (long j0 = 0; j0 < vocab && chosen < 0; j0 += SPAN) {
            long j1 = j0 + SPAN < vocab ? j0 + SPAN : vocab;
            double span = 0.0;
            #pragma omp simd reduction(+:span)
            for (long j = j0; j < j1; j++) span += scaled_exp(x[j], inverse_t, m);
            if (running + span < target) {
                running += span;
                continue;
            }
            for (long j = j0; j < j1; j++) {
                float e = scaled_exp(x[j], inverse_t, m);
                running += e;
                if (running >= target && e > 0.f) {
                    chosen = j;
                    break;
                }
            }
        }
        /* Rounding left the target past the whole sum: the last token that can be drawn (the
           largest logit's, at least: its e is 1). */
        for (long j = vocab - 1; chosen < 0 && j >= 0; j--)
            if (scaled_exp(x[j], inverse_t, m) > 0.f) chosen = j;
        double log_s = log(s);
        token[r] = chosen;
        log_prob[r] = (float)((double)(x[chosen] * inverse_t - m) - log_s);
        entropy[r] = (float)(log_s - moment / s);
    }
}
