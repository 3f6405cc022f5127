/* Vectorizable math shared by the kernels of this folder (each compiled on its own by `build.py`,
   which hashes this header with the source). */

#ifndef HFLOW_VECTOR_MATH_H
#define HFLOW_VECTOR_MATH_H

#include <math.h>

/* exp(x) for x <= 0 (a score minus its row's largest; silu's -|x|): 2^n * p(r) with r = x - n ln 2 in
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

/* sigmoid(x) = 1 / (1 + exp(-x)) for any x, through e = exp(-|x|) (never above 1, so never
   overflowing): 1 / (1 + e) for x >= 0, e / (1 + e) below. */
static inline float sigmoid(float x) {
    float e = exp_nonpositive(x < 0.f ? x : -x);
    return (x < 0.f ? e : 1.f) / (1.f + e);
}

static inline float silu(float x) { return x * sigmoid(x); }

#endif
