/* The products of the runner's "native" weight layout (float32 weights) and of the "int8native"
   draft weights (int8 weights, a float32 scale per output row), compiled for the CPU they run on.

   y[m, o] = sum_i x[m, i] * W[o, i] (+ bias[o]) for a block of M rows, W held as panels:
   the output rows cut into tiles of T (the last one padded with zero rows), each tile stored
   input-major, [n_tiles, I, T]. One pass over a tile streams it once from memory and updates
   T outputs of up to MB rows, so a one-row product reads the weights sequentially at the
   memory's speed and a block of rows reuses each weight load MB times.

   Every output element is summed in the same order (i = 0, 1, ..., I-1, one fused multiply-add
   each) whatever M, the row's place in the block, or the number of threads: a row's result is
   bitwise the same computed alone or in any block. Threads split the tiles (OpenMP; without
   it, one thread). The vector width and the block sizes follow the instruction set the
   compiler targets (-march=native); T is reported by selfspec_native_tile(). */

#include <stddef.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

/* The vector type and its operations per instruction set. Loads, stores and fused multiply-adds
   are intrinsics so that the code does not hang on the compiler's tuning: under some -march
   tunings a generic vector copied by memcpy is split into narrow loads and its accumulators
   are spilled to the stack, several times slower. */
#if defined(__AVX512F__)
#define VW 16
#define MB 12
typedef __m512 vf;
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps((p), (v))
#define VFMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define VSPLAT(s) _mm512_set1_ps(s)
#define VZERO() _mm512_setzero_ps()
#elif defined(__AVX__)
#define VW 8
#define MB 6
typedef __m256 vf;
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_storeu_ps((p), (v))
#if defined(__FMA__)
#define VFMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#else
#define VFMA(a, b, c) _mm256_add_ps(_mm256_mul_ps((a), (b)), (c)) /* no FMA: a rounded product, then the sum */
#endif
#define VSPLAT(s) _mm256_set1_ps(s)
#define VZERO() _mm256_setzero_ps()
#elif defined(__SSE2__) && !defined(__AVX__)
#define VW 4
#define MB 4
typedef __m128 vf;
#define VLOAD(p) _mm_loadu_ps(p)
#define VSTORE(p, v) _mm_storeu_ps((p), (v))
#define VFMA(a, b, c) _mm_add_ps(_mm_mul_ps((a), (b)), (c)) /* no FMA: a rounded product, then the sum */
#define VSPLAT(s) _mm_set1_ps(s)
#define VZERO() _mm_setzero_ps()
#else
#define VW 8
#define MB 4
typedef float vf __attribute__((vector_size(VW * 4), aligned(4)));
#define SPLAT8(s) s, s, s, s, s, s, s, s
static inline vf generic_load(const float *p) { vf v; __builtin_memcpy(&v, p, sizeof v); return v; }
#define VLOAD(p) generic_load(p)
static inline void generic_store(float *p, vf v) { __builtin_memcpy(p, &v, sizeof v); }
#define VSTORE(p, v) generic_store((p), (v))
#define VFMA(a, b, c) ((a) * (b) + (c))
#define VSPLAT(s) ((vf){SPLAT8(s)})
#define VZERO() ((vf){0})
#endif
#define NV 2
#define T (VW * NV)

int selfspec_native_tile(void) { return T; }
int selfspec_native_rows(void) { return MB; }

/* VW int8 weights at p as floats (one sign-extension and one conversion where the ISA has them). */
static inline vf widen(const signed char *p) {
#if defined(__AVX512F__)
    return (vf)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
#elif defined(__AVX2__)
    return (vf)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
#elif defined(__SSE4_1__) && !defined(__AVX__)
    int four;
    __builtin_memcpy(&four, p, sizeof four);
    return _mm_cvtepi32_ps(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(four)));
#else
    vf r;
    for (int k = 0; k < VW; k++) r[k] = (float)p[k];
    return r;
#endif
}

/* NV vectors of the weights at element offset off: float32 panels, or int8 panels widened. */
static inline __attribute__((always_inline)) void weights_at(const void *w, int q8, size_t off, vf out[NV]) {
    for (int v = 0; v < NV; v++)
        out[v] = q8 ? widen((const signed char *)w + off + (size_t)v * VW) : VLOAD((const float *)w + off + (size_t)v * VW);
}

/* mb (<= MB) rows of x [.., I] against one tile [I, T]; writes nout (<= T) columns of y,
   each times its scale (int8 panels) and plus its bias (where given). */
static inline __attribute__((always_inline)) void tile_rows(const float *x, const void *w, int q8, const float *scale,
                                                             const float *bias, float *y, int mb, int I, int O,
                                                             int nout) {
    vf acc[MB][NV];
    for (int m = 0; m < MB; m++)
        for (int v = 0; v < NV; v++) acc[m][v] = VZERO();
    for (int i = 0; i < I; i++) {
        vf wv[NV];
        weights_at(w, q8, (size_t)i * T, wv);
        for (int m = 0; m < MB; m++) {
            if (m < mb) {
                float s = x[(size_t)m * I + i];
                vf xb = VSPLAT(s);
                for (int v = 0; v < NV; v++) acc[m][v] = VFMA(wv[v], xb, acc[m][v]);
            }
        }
    }
    float out[T];
    for (int m = 0; m < mb; m++) {
        for (int v = 0; v < NV; v++) VSTORE(out + v * VW, acc[m][v]);
        for (int j = 0; j < nout; j++) {
            float r = scale ? out[j] * scale[j] : out[j];
            y[(size_t)m * O + j] = bias ? r + bias[j] : r;
        }
    }
}

#define ROWS(n) case n: tile_rows(xm, wt, q8, st, bt, yt, n, I, O, nout); break;

/* Threads split the tiles; each tile is read once per block of MB rows. A macro, not a function,
   so that each product below has its own parallel region with Q8 a constant in it (OpenMP
   outlines the region before constants are propagated into it). */
#define PRODUCT(Q8, ELEM)                                                                          \
    int tiles = (O + T - 1) / T;                                                                   \
    (void)threads;                                                                                 \
    _Pragma("omp parallel for num_threads(threads) schedule(static)")                             \
    for (int t = 0; t < tiles; t++) {                                                              \
        int nout = O - t * T < T ? O - t * T : T;                                                  \
        const void *wt = (const char *)panels + (size_t)t * I * T * (ELEM);                        \
        const float *st = scale ? scale + (size_t)t * T : NULL;                                    \
        const float *bt = bias ? bias + (size_t)t * T : NULL;                                      \
        const int q8 = (Q8);                                                                       \
        for (int m0 = 0; m0 < M; m0 += MB) {                                                       \
            const float *xm = x + (size_t)m0 * I;                                                  \
            float *yt = y + (size_t)m0 * O + (size_t)t * T;                                        \
            switch (M - m0 < MB ? M - m0 : MB) { ALL_ROWS default: break; }                        \
        }                                                                                          \
    }

#if MB > 6
#define ALL_ROWS ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7) ROWS(8) ROWS(9) ROWS(10) ROWS(11) ROWS(12)
#elif MB > 4
#define ALL_ROWS ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6)
#else
#define ALL_ROWS ROWS(1) ROWS(2) ROWS(3) ROWS(4)
#endif

/* y [M, O] = x [M, I] @ W.T (+ bias [O]), W as float32 panels [tiles, I, T]. */
void selfspec_native_linear(const float *x, const float *panels, const float *bias, float *y,
                            int M, int O, int I, int threads) {
    const float *scale = NULL;
    PRODUCT(0, sizeof(float))
}

/* The same with W = q * scale[:, None]: q as int8 panels [tiles, I, T], scale [tiles * T]
   (one per output row, the padding rows' included). Activations stay float32. */
void selfspec_native_linear_int8(const float *x, const signed char *panels, const float *scale, const float *bias,
                                 float *y, int M, int O, int I, int threads) {
    PRODUCT(1, 1)
}
