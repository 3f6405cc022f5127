/* Vectorizable math shared by the kernels of this folder (each compiled on its own by `build.py`,
   which hashes this header with the source). */

#ifndef HFLOW_VECTOR_MATH_H
#define HFLOW_VECTOR_MATH_H

#include <math.h>

/* p(r) = e^r on [-ln2/2, ln2/2] from p holding the series' first coefficient: the degree-7 series
   of Cephes' expf, for a float or for `lanes`. */
#define EXP_SERIES(p, r) do { \
        p = p * r + 1.3981999507e-3f; \
        p = p * r + 8.3334519073e-3f; \
        p = p * r + 4.1665795894e-2f; \
        p = p * r + 1.6666665459e-1f; \
        p = p * r + 5.0000001201e-1f; \
        p = p * r * r + r + 1.0f; \
    } while (0)

/* 16 floats as one value of GCC's (and clang's) vector extensions: the compiler lowers it to the
   host's registers (one AVX-512 register, two AVX ones, four SSE ones). LANES is defined where the
   compiler has them. */
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
#define LANES 16
typedef float lanes __attribute__((vector_size(64)));

static inline lanes load_lanes(const float *p) { lanes v; __builtin_memcpy(&v, p, sizeof v); return v; }
static inline void store_lanes(float *p, lanes v) { __builtin_memcpy(p, &v, sizeof v); }

/* The sum of v's lanes, halves added in turn (8, 4, 2, 1 apart): four shuffles, four additions. */
static inline float lane_sum(lanes v) {
    v += __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
    v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    v += __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
    return v[0];
}

/* 16 ints, as comparisons of `lanes` give them (-1 where true, 0 where false). */
typedef int ints __attribute__((vector_size(64)));

/* where m: a, else b (lane by lane). */
static inline lanes select_lanes(ints m, lanes a, lanes b) { return (lanes)((m & (ints)a) | (~m & (ints)b)); }

static inline lanes max_lanes(lanes a, lanes b) { return select_lanes(a > b, a, b); }

/* The largest of v's lanes, halves compared in turn as `lane_sum` adds them. */
static inline float lane_max(lanes v) {
    v = max_lanes(v, __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
    v = max_lanes(v, __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));
    v = max_lanes(v, __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));
    v = max_lanes(v, __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14));
    return v[0];
}

/* `exp_nonpositive` of each lane, in vectors: the same clamp, reduction and series. */
static inline lanes exp_lanes(lanes x) {
    const lanes low = (lanes){0} - 87.0f;
    x = max_lanes(x, low);
    lanes y = x * 1.44269504088896341f + 0.5f;
    lanes n = __builtin_convertvector(__builtin_convertvector(y, ints), lanes);  /* toward zero */
    n = select_lanes(n > y, n - 1.0f, n);                                      /* floor */
    lanes r = x - n * 0.693359375f + n * 2.12194440e-4f;
    lanes p = (lanes){0} + 1.9875691500e-4f;
    EXP_SERIES(p, r);
    ints two_n = (__builtin_convertvector(n, ints) + 127) << 23;
    return p * (lanes)two_n;
}
#endif

/* exp(x) for x <= 0 (a score minus its row's largest; silu's -|x|): 2^n * p(r) with r = x - n ln 2 in
   [-ln2/2, ln2/2] and p the degree-7 series of Cephes' expf (relative error about 1e-7), written
   so that the compiler vectorizes it; below -87 the result is at most 1.6e-38. */
static inline float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x;
    float n = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    EXP_SERIES(p, r);
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
