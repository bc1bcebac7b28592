/* The products of the runner's "native" weight layout (float32 weights), of the "int8native"
   draft weights (int8 weights, a float32 scale per output row) and of the "int4native" draft
   weights (4-bit codes, a scale and an offset per group of inputs and output row), compiled for
   the CPU they run on.

   y[m, o] = sum_i x[m, i] * W[o, i] (+ bias[o]) for a block of M rows, W held as panels:
   the output rows cut into tiles of T (the last one padded with zero rows), each tile stored
   input-major, [n_tiles, I, T]. One pass over a tile streams it once from memory and updates
   T outputs of up to MB rows, so a one-row product reads the weights sequentially at the
   memory's speed and a block of rows reuses each weight load MB times.

   Every output element is summed in the same order (i = 0, 1, ..., I-1, one fused multiply-add
   each) whatever M, the row's place in the block, or the number of threads: a row's result is
   bitwise the same computed alone or in any block. Threads split the tiles (OpenMP; without
   it, one thread). The vector width and the block sizes follow the instruction set the
   compiler targets (-march=native); T is reported by selfspec_native_tile(), and the int8 and
   4-bit panels' tile TQ (two vectors) by selfspec_native_tile_q(). */

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
#define NV 2
#define MB 12
#define MBQ 12
#define MB4 6
typedef __m512 vf;
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps((p), (v))
#define VFMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define VSPLAT(s) _mm512_set1_ps(s)
#define VZERO() _mm512_setzero_ps()
#elif defined(__AVX__)
/* 16 vector registers. float32: one weight vector per input by up to 12 rows, the rows split
   into blocks of equal size (16 rows: 8 + 8, not 12 + 4) and the weights prefetched ahead of the
   stream (on a Zen 3 measured, a block of 8 rows then costs what one row costs, and 10 or 12
   rows one pass, not two; two vectors by 6 rows read each weight twice for 8). int8: two vectors
   by 6 rows (one vector leaves a one-row product waiting on its multiply-adds' latency behind
   each widening). Blocks of few rows run several tiles at once (GROUP_ACC below). */
#define VW 8
#define NV 1
#define MB 12
#define MBQ 6
#define MB4 3
#define PREFETCH_AHEAD 64
#define BALANCED_BLOCKS 1
#define GROUP_ACC 8
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
#define NV 2
#define MB 4
#define MBQ 4
#define MB4 2
typedef __m128 vf;
#define VLOAD(p) _mm_loadu_ps(p)
#define VSTORE(p, v) _mm_storeu_ps((p), (v))
#define VFMA(a, b, c) _mm_add_ps(_mm_mul_ps((a), (b)), (c)) /* no FMA: a rounded product, then the sum */
#define VSPLAT(s) _mm_set1_ps(s)
#define VZERO() _mm_setzero_ps()
#else
#define VW 8
#define NV 2
#define MB 4
#define MBQ 4
#define MB4 2
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
#ifndef BALANCED_BLOCKS
#define BALANCED_BLOCKS 0 /* blocks of MB rows and the rest */
#endif
#define T (VW * NV)  /* float32 tiles */
#define NVQ 2        /* vectors per input of the int8 and 4-bit tiles */
#define TQ (VW * NVQ) /* int8 and 4-bit tiles (a 4-bit byte holds the codes of outputs j and j + VW) */
#define MBMAX (MB > MBQ ? MB : MBQ)

int selfspec_native_tile(void) { return T; }
int selfspec_native_tile_q(void) { return TQ; }
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

/* The tile's weights for input i: NV float32 vectors, or NVQ int8 vectors widened. */
static inline __attribute__((always_inline)) void weights_at(const void *w, int q8, int i, vf out[NVQ]) {
    if (q8)
        for (int v = 0; v < NVQ; v++) out[v] = widen((const signed char *)w + (size_t)i * TQ + (size_t)v * VW);
    else
        for (int v = 0; v < NV; v++) out[v] = VLOAD((const float *)w + (size_t)i * T + (size_t)v * VW);
}

/* Tiles in flight per block of mb rows (nv vectors per input). A multiply-add waits on the one
   before it in its accumulator, and every row of a tile waits on the same weight load, so one
   tile reads at most one vector per multiply-add latency whatever the rows (on a Zen 3, about 8
   bytes a cycle: a one-row float32 product at 30-37 GB/s, an int8 one at 22). Blocks of few rows
   therefore run TILES_FOR(mb, nv) consecutive tiles at once, up to GROUP_ACC accumulators
   (measured on a Zen 3: 8; 12 spills at 6 rows). Each output is still summed in the same
   order, so the results are bitwise those of one tile at a time. */
#ifndef GROUP_ACC
#define GROUP_ACC 0 /* one tile at a time (AVX-512's two vectors of 16 keep enough in flight) */
#endif
#define GROUP_MAX 4
#define TILES_FOR(mb, nv) (GROUP_ACC / ((mb) * (nv)) < 1 ? 1 : GROUP_ACC / ((mb) * (nv)) > GROUP_MAX ? GROUP_MAX : GROUP_ACC / ((mb) * (nv)))

/* mb (<= MB, or MBQ for int8) rows of x [.., I] against one tile [I, T or TQ]; writes nout
   columns of y, each times its scale (int8 panels) and plus its bias (where given). q8 is a
   constant where this is inlined, so are the vectors per input (nv) and the block (mbx). */
static inline __attribute__((always_inline)) void tile_rows(const float *x, const void *w, int q8, const float *scale,
                                                             const float *bias, float *y, int mb, int I, int O,
                                                             int nout) {
    const int nv = q8 ? NVQ : NV, mbx = q8 ? MBQ : MB; /* NV <= NVQ */
    vf acc[MBMAX][NVQ];
    for (int m = 0; m < mbx; m++)
        for (int v = 0; v < nv; v++) acc[m][v] = VZERO();
    for (int i = 0; i < I; i++) {
        vf wv[NVQ];
#ifdef PREFETCH_AHEAD
        if (!q8) __builtin_prefetch((const float *)w + (size_t)(i + PREFETCH_AHEAD) * T, 0, 3);
#endif
        weights_at(w, q8, i, wv);
        for (int m = 0; m < mbx; m++) {
            if (m < mb) {
                float s = x[(size_t)m * I + i];
                vf xb = VSPLAT(s);
                for (int v = 0; v < nv; v++) acc[m][v] = VFMA(wv[v], xb, acc[m][v]);
            }
        }
    }
    float out[TQ > T ? TQ : T];
    for (int m = 0; m < mb; m++) {
        for (int v = 0; v < nv; v++) VSTORE(out + v * VW, acc[m][v]);
        for (int j = 0; j < nout; j++) {
            float r = scale ? out[j] * scale[j] : out[j];
            y[(size_t)m * O + j] = bias ? r + bias[j] : r;
        }
    }
}

/* The same for nt (<= TILES_FOR(mb, nv)) consecutive tiles (kept apart from tile_rows: the one
   function for both, with one tile, compiled to code 10-25 % slower at 8 and 12 rows on a Zen 3).
   The nt tiles are each [I, T or TQ] and wstride elements after the one before; writes nt tiles' columns
   of y (the last one's first nlast), each times its scale (int8 panels) and plus its bias (where
   given). q8 is a constant where this is inlined, so are the vectors per input (nv), the block
   (mbx) and the tiles in flight (ntx). */
static inline __attribute__((always_inline)) void tile_group_rows(const float *x, const void *w, size_t wstride, int q8,
                                                             const float *scale, const float *bias, float *y, int mb,
                                                             int nt, int I, int O, int nlast) {
    const int nv = q8 ? NVQ : NV, mbx = q8 ? MBQ : MB, tt = q8 ? TQ : T; /* NV <= NVQ */
    const int ntx = TILES_FOR(mb, nv);
    vf acc[GROUP_MAX][MBMAX][NVQ];
    for (int g = 0; g < ntx; g++)
        for (int m = 0; m < mbx; m++)
            for (int v = 0; v < nv; v++) acc[g][m][v] = VZERO();
    for (int i = 0; i < I; i++) {
        for (int g = 0; g < ntx; g++) {
            if (g < nt) {
                const void *wg = q8 ? (const void *)((const signed char *)w + g * wstride)
                                    : (const void *)((const float *)w + g * wstride);
                vf wv[NVQ];
#ifdef PREFETCH_AHEAD
                if (!q8) __builtin_prefetch((const float *)wg + (size_t)(i + PREFETCH_AHEAD) * T, 0, 3);
#endif
                weights_at(wg, q8, i, wv);
                for (int m = 0; m < mbx; m++) {
                    if (m < mb) {
                        float s = x[(size_t)m * I + i];
                        vf xb = VSPLAT(s);
                        for (int v = 0; v < nv; v++) acc[g][m][v] = VFMA(wv[v], xb, acc[g][m][v]);
                    }
                }
            }
        }
    }
    float out[TQ > T ? TQ : T];
    for (int g = 0; g < ntx; g++) {
        if (g < nt) {
            int nout = g == nt - 1 ? nlast : tt;
            const float *sg = scale ? scale + g * tt : NULL, *bg = bias ? bias + g * tt : NULL;
            for (int m = 0; m < mb; m++) {
                for (int v = 0; v < nv; v++) VSTORE(out + v * VW, acc[g][m][v]);
                for (int j = 0; j < nout; j++) {
                    float r = sg ? out[j] * sg[j] : out[j];
                    y[(size_t)m * O + g * tt + j] = bg ? r + bg[j] : r;
                }
            }
        }
    }
}

#define ROWS(n)                                                                                    \
    case n:                                                                                        \
        if (TILES_FOR(n, q8 ? NVQ : NV) > 1)                                                       \
            tile_group_rows(xm, wt, (size_t)I * tt, q8, st, bt, yt, n, nt, I, O, nlast);            \
        else                                                                                       \
            tile_rows(xm, wt, q8, st, bt, yt, n, I, O, nlast);                                     \
        break;

/* Threads split the groups of tiles; each group is read once per block of up to MB rows (MBQ for
   int8). A macro, not a function, so that each product below has its own parallel region with
   Q8 a constant in it (OpenMP outlines the region before constants are propagated into it). */
#define PRODUCT(Q8, ELEM)                                                                          \
    const int tt = (Q8) ? TQ : T, mbx = (Q8) ? MBQ : MB;                                           \
    const int tiles = (O + tt - 1) / tt;                                                           \
    const int per = BALANCED_BLOCKS ? (M + (M + mbx - 1) / mbx - 1) / ((M + mbx - 1) / mbx) : mbx; \
    const int gt = TILES_FOR(per < M ? per : M, (Q8) ? NVQ : NV);                                  \
    const int ngroups = (tiles + gt - 1) / gt;                                                     \
    (void)threads;                                                                                 \
    _Pragma("omp parallel for num_threads(threads) schedule(static)")                             \
    for (int gi = 0; gi < ngroups; gi++) {                                                         \
        const int t = gi * gt, nt = tiles - t < gt ? tiles - t : gt;                               \
        const int nlast = O - (t + nt - 1) * tt < tt ? O - (t + nt - 1) * tt : tt;                \
        const void *wt = (const char *)panels + (size_t)t * I * tt * (ELEM);                       \
        const float *st = scale ? scale + (size_t)t * tt : NULL;                                   \
        const float *bt = bias ? bias + (size_t)t * tt : NULL;                                     \
        const int q8 = (Q8);                                                                       \
        for (int m0 = 0; m0 < M; m0 += per) {                                                      \
            const float *xm = x + (size_t)m0 * I;                                                  \
            float *yt = y + (size_t)m0 * O + (size_t)t * tt;                                       \
            switch (M - m0 < per ? M - m0 : per) { ALL_ROWS default: break; }                      \
        }                                                                                          \
    }

#if MBMAX > 8
#define ALL_ROWS ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7) ROWS(8) ROWS(9) ROWS(10) ROWS(11) ROWS(12)
#elif MBMAX > 6
#define ALL_ROWS ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7) ROWS(8)
#elif MBMAX > 4
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

/* The same with W = q * scale[:, None]: q as int8 panels [tiles, I, TQ], scale [tiles * TQ]
   (one per output row, the padding rows' included). Activations stay float32. */
void selfspec_native_linear_int8(const float *x, const signed char *panels, const float *scale, const float *bias,
                                 float *y, int M, int O, int I, int threads) {
    PRODUCT(1, 1)
}

/* ---- 4-bit weights: W[o, i] = code[o, i] * gscale[o, g] + gzero[o, g], g = i / G ----------
   4-bit panels have tiles of TQ = 2 * VW outputs, as int8 ones (selfspec_native_tile_q()): a
   tile row holds the TQ codes (0..15) of one input in TQ / 2 bytes, byte j holding output j's
   code in its low nibble and output j + VW's in its high one. Each group is summed
   over the codes themselves, sum_i code * x, and then scaled: acc += gsum * s + z * sum_i x
   (the x sums precomputed per row and group), so a weight costs its conversion and one
   multiply-add per row. Twice the accumulators: blocks of MB4 rows. */

/* The codes of one tile row at p as floats: out[0] the low nibbles, out[1] the high ones. */
static inline __attribute__((always_inline)) void codes_at(const unsigned char *p, vf out[NVQ]) {
#if defined(__AVX512F__)
    __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    out[0] = _mm512_cvtepi32_ps(_mm512_and_si512(d, _mm512_set1_epi32(15)));
    out[1] = _mm512_cvtepi32_ps(_mm512_srli_epi32(d, 4));
#elif defined(__AVX2__)
    __m256i d = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    out[0] = _mm256_cvtepi32_ps(_mm256_and_si256(d, _mm256_set1_epi32(15)));
    out[1] = _mm256_cvtepi32_ps(_mm256_srli_epi32(d, 4));
#elif defined(__SSE4_1__) && !defined(__AVX__)
    int four;
    __builtin_memcpy(&four, p, sizeof four);
    __m128i d = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(four));
    out[0] = _mm_cvtepi32_ps(_mm_and_si128(d, _mm_set1_epi32(15)));
    out[1] = _mm_cvtepi32_ps(_mm_srli_epi32(d, 4));
#else
    for (int k = 0; k < VW; k++) {
        out[0][k] = (float)(p[k] & 15);
        out[1][k] = (float)(p[k] >> 4);
    }
#endif
}

/* mb (<= MB4) rows of x [.., I] against one 4-bit tile; gs, gz [groups, TQ] the tile's scales
   and offsets, xs [rows, groups] the x sums of the block's rows. */
static inline __attribute__((always_inline)) void tile_rows_q4(const float *x, const unsigned char *w,
                                                                const float *gs, const float *gz, const float *xs,
                                                                int G, int groups, const float *bias, float *y,
                                                                int mb, int I, int O, int nout) {
    vf acc[MB4][NVQ];
    for (int m = 0; m < MB4; m++)
        for (int v = 0; v < NVQ; v++) acc[m][v] = VZERO();
    for (int g = 0; g < groups; g++) {
        vf gacc[MB4][NVQ];
        for (int m = 0; m < MB4; m++)
            for (int v = 0; v < NVQ; v++) gacc[m][v] = VZERO();
        int i1 = I - g * G < G ? I : (g + 1) * G;
        for (int i = g * G; i < i1; i++) {
            vf c[NVQ];
            codes_at(w + (size_t)i * (TQ / 2), c);
            for (int m = 0; m < MB4; m++) {
                if (m < mb) {
                    vf xb = VSPLAT(x[(size_t)m * I + i]);
                    for (int v = 0; v < NVQ; v++) gacc[m][v] = VFMA(c[v], xb, gacc[m][v]);
                }
            }
        }
        for (int v = 0; v < NVQ; v++) {
            vf sv = VLOAD(gs + (size_t)g * TQ + (size_t)v * VW), zv = VLOAD(gz + (size_t)g * TQ + (size_t)v * VW);
            for (int m = 0; m < MB4; m++) {
                if (m < mb) {
                    acc[m][v] = VFMA(gacc[m][v], sv, acc[m][v]);
                    acc[m][v] = VFMA(zv, VSPLAT(xs[(size_t)m * groups + g]), acc[m][v]);
                }
            }
        }
    }
    float out[TQ];
    for (int m = 0; m < mb; m++) {
        for (int v = 0; v < NVQ; v++) VSTORE(out + v * VW, acc[m][v]);
        for (int j = 0; j < nout; j++) y[(size_t)m * O + j] = bias ? out[j] + bias[j] : out[j];
    }
}

#define ROWS4(n) case n: tile_rows_q4(xm, wt, gst, gzt, xsm, G, groups, bt, yt, n, I, O, nout); break;
#if MB4 > 3
#define ALL_ROWS4 ROWS4(1) ROWS4(2) ROWS4(3) ROWS4(4) ROWS4(5) ROWS4(6)
#elif MB4 > 2
#define ALL_ROWS4 ROWS4(1) ROWS4(2) ROWS4(3)
#else
#define ALL_ROWS4 ROWS4(1) ROWS4(2)
#endif

/* xsum [M, groups] = the sums of each row of x [M, I] over each group of G inputs, in input order. */
static void group_sums(const float *x, float *xsum, int M, int I, int G) {
    const int groups = (I + G - 1) / G;
    for (int m = 0; m < M; m++)
        for (int g = 0; g < groups; g++) {
            float sum = 0.0f;
            int i1 = I - g * G < G ? I : (g + 1) * G;
            for (int i = g * G; i < i1; i++) sum += x[(size_t)m * I + i];
            xsum[(size_t)m * groups + g] = sum;
        }
}

/* y [M, O] = x [M, I] @ W.T (+ bias [O]) with 4-bit W in groups of G inputs: the codes as
   panels [tiles, I, TQ / 2] bytes, gscale and gzero [tiles, groups, TQ] (the padding rows'
   included), xsum [M, groups] scratch for the x sums. Activations stay float32. */
void selfspec_native_linear_int4(const float *x, const unsigned char *panels, const float *gscale,
                                 const float *gzero, int G, const float *bias, float *y, float *xsum, int M,
                                 int O, int I, int threads) {
    int tiles = (O + TQ - 1) / TQ, groups = (I + G - 1) / G;
    group_sums(x, xsum, M, I, G);
    (void)threads;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int t = 0; t < tiles; t++) {
        int nout = O - t * TQ < TQ ? O - t * TQ : TQ;
        const unsigned char *wt = panels + (size_t)t * I * (TQ / 2);
        const float *gst = gscale + (size_t)t * groups * TQ, *gzt = gzero + (size_t)t * groups * TQ;
        const float *bt = bias ? bias + (size_t)t * TQ : NULL;
        for (int m0 = 0; m0 < M; m0 += MB4) {
            const float *xm = x + (size_t)m0 * I, *xsm = xsum + (size_t)m0 * groups;
            float *yt = y + (size_t)m0 * O + (size_t)t * TQ;
            switch (M - m0 < MB4 ? M - m0 : MB4) { ALL_ROWS4 default: break; }
        }
    }
}

/* ---- 4-bit weights by 8-bit integer products (AVX2): the "int4avx2" draft weights ---------
   The int4native weights W[o, i] = code[o, i] * gscale[o, g] + gzero[o, g] (g = i / G) by
   activations rounded per row to integers of a scale of their own (by the threads, a row each):
   - products of up to MBF (2) rows (a chain's draft pass): to 15-bit integers,
     xq = round(x / s) in -16383..16383, s = max|x| / 16383, split into two signed bytes
     xq = 128 * hi + lo (hi = xq >> 7 in -128..127, lo = xq & 127), two products per weight;
   - wider products: to 8-bit integers, xq in -127..127, s = max|x| / 127, one product.
   The codes (0..15) are the unsigned and the activation bytes the signed operand of vpmaddubsw:
   a pair's sum is at most 2 * 15 * 128 = 3840, so eight steps of four inputs sum exactly in
   16-bit lanes (30720 < 32767) before vpmaddwd widens them; a group's sum is exact in int32
   (|128 * sum code * hi| <= 128 * 15 * 128 * G < 2^31 for G <= 8192), then scaled:
   y = s * sum_g gscale * sum_{i in g} code * xq + sum_g gzero * sum_{i in g} x. A row's result
   depends on its own values and on the product's width only (which of the two). Panels: per
   tile of TA (16) outputs and four consecutive inputs, 32 bytes whose low nibbles are outputs
   0..7's four codes (one 32-bit lane each) and whose high nibbles are outputs 8..15's:
   [tiles, ceil(I / 4), 8, 4] bytes; gscale, gzero [tiles, groups, TA]; G a multiple of 4.
   Compiled where the target has AVX2 and FMA: selfspec_native_i4avx2() says whether it was. */
#if defined(__AVX2__) && defined(__FMA__)
#define HAS_I4AVX2 1
#else
#define HAS_I4AVX2 0
#endif
int selfspec_native_i4avx2(void) { return HAS_I4AVX2; }
#define TA 16 /* outputs per panel (INT4_AVX2_TILE in panels.py) */
int selfspec_native_i4avx2_tile(void) { return TA; }
#ifndef MBF
#define MBF 2 /* rows computed with 15-bit activations, and their block (INT4_AVX2_FINE_ROWS in panels.py) */
#endif
int selfspec_native_i4avx2_fine(void) { return MBF; }

#if HAS_I4AVX2
#define MBA 4  /* rows per pass over a panel (8-bit activations) */
#define SUM16 8 /* steps of four inputs summed in 16-bit lanes before widening */

/* Row m of x [M, I] rounded to integers of its own scale xs[m] = max|x| / top (to nearest,
   ties to even): with two (top 16383), the high bytes then the low ones (rows of 2 * Ip
   bytes); without (top 127), one byte each (rows of Ip); Ip = ceil(I / 4) * 4, the padding 0.
   And its sums per group of G inputs (xsum [M, groups]); eight lanes at a time. */
static void prepare_row_i4avx2(const float *x, signed char *xq, float *xs, float *xsum, int m, int I, int Ip,
                               int G, int groups, int two) {
    const float *xr = x + (size_t)m * I;
    signed char *hi = xq + (size_t)m * (two ? 2 : 1) * Ip, *lo = hi + Ip;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 vmax = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= I; i += 8) vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(xr + i), absmask));
    float lanes[8], amax = 0.0f;
    _mm256_storeu_ps(lanes, vmax);
    for (int k = 0; k < 8; k++) amax = lanes[k] > amax ? lanes[k] : amax;
    for (; i < I; i++) amax = __builtin_fabsf(xr[i]) > amax ? __builtin_fabsf(xr[i]) : amax;
    const float top = two ? 16383.0f : 127.0f, s = amax > 0.0f ? amax / top : 1.0f, inv = 1.0f / s;
    const __m256 vinv = _mm256_set1_ps(inv), vtop = _mm256_set1_ps(top), vbottom = _mm256_set1_ps(-top);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7), seven = _mm256_set1_epi32(127);
    i = 0;
    for (; i + 32 <= I; i += 32) {
        __m256i v[4];
        for (int k = 0; k < 4; k++) {
            __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + i + 8 * k), vinv),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            v[k] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, vbottom), vtop));
        }
        if (two) {
            __m256i l[4];
            for (int k = 0; k < 4; k++) {
                l[k] = _mm256_and_si256(v[k], seven);
                v[k] = _mm256_srai_epi32(v[k], 7);
            }
            __m256i lb = _mm256_packs_epi16(_mm256_packs_epi32(l[0], l[1]), _mm256_packs_epi32(l[2], l[3]));
            _mm256_storeu_si256((__m256i *)(lo + i), _mm256_permutevar8x32_epi32(lb, order));
        }
        __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
        _mm256_storeu_si256((__m256i *)(hi + i), _mm256_permutevar8x32_epi32(bytes, order));
    }
    for (; i < I; i++) {
        float r = __builtin_nearbyintf(xr[i] * inv);
        int q = (int)(r > top ? top : (r < -top ? -top : r));
        if (two) {
            hi[i] = (signed char)(q >> 7);
            lo[i] = (signed char)(q & 127);
        } else {
            hi[i] = (signed char)q;
        }
    }
    for (; i < Ip; i++) {
        hi[i] = 0;
        if (two) lo[i] = 0;
    }
    xs[m] = s;
    for (int g = 0; g < groups; g++) {
        const int i0 = g * G, i1 = I - i0 < G ? I : i0 + G;
        __m256 acc = _mm256_setzero_ps();
        int k = i0;
        for (; k + 8 <= i1; k += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(xr + k));
        _mm256_storeu_ps(lanes, acc);
        float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
        for (; k < i1; k++) sum += xr[k];
        xsum[(size_t)m * groups + g] = sum;
    }
}

/* One step of four inputs for a block's mb rows: the 16 outputs' codes lo4, hi4 (nibbles) times
   each row's activation bytes (rows of stride bytes, the high or only bytes first, the low ones
   Ip after them), summed into a16 and, with two, l16. */
static inline __attribute__((always_inline)) void dot_step_i4avx2(const signed char *xq, size_t stride, size_t Ip,
                                                                   int k, __m256i c0, __m256i c1,
                                                                   __m256i a16[][2], __m256i l16[][2], int mb,
                                                                   int two) {
    for (int m = 0; m < MBA; m++) {
        if (m < mb) {
            int h4;
            __builtin_memcpy(&h4, xq + (size_t)m * stride + (size_t)k * 4, 4);
            __m256i xb = _mm256_set1_epi32(h4);
            a16[m][0] = _mm256_add_epi16(a16[m][0], _mm256_maddubs_epi16(c0, xb));
            a16[m][1] = _mm256_add_epi16(a16[m][1], _mm256_maddubs_epi16(c1, xb));
            if (two && m < MBF) {
                int l4;
                __builtin_memcpy(&l4, xq + (size_t)m * stride + Ip + (size_t)k * 4, 4);
                __m256i lb = _mm256_set1_epi32(l4);
                l16[m][0] = _mm256_add_epi16(l16[m][0], _mm256_maddubs_epi16(c0, lb));
                l16[m][1] = _mm256_add_epi16(l16[m][1], _mm256_maddubs_epi16(c1, lb));
            }
        }
    }
}

static inline __attribute__((always_inline)) void tile_rows_i4avx2(const signed char *xq, const unsigned char *w,
                                                                    const float *xs, const float *xsum,
                                                                    const float *gs, const float *gz,
                                                                    const float *bias, float *y, int mb, int K4,
                                                                    int G, int groups, int O, int nout, int two) {
    const size_t Ip = (size_t)K4 * 4, stride = (two ? 2 : 1) * Ip;
    const __m256i nib = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    const int KG = G / 4;
    __m256 acc[MBA][2];
    for (int m = 0; m < MBA; m++)
        for (int v = 0; v < 2; v++) acc[m][v] = _mm256_setzero_ps();
    for (int g = 0; g < groups; g++) {
        __m256i a32[MBA][2], l32[MBF][2];
        for (int m = 0; m < MBA; m++)
            for (int v = 0; v < 2; v++) a32[m][v] = _mm256_setzero_si256();
        for (int m = 0; m < MBF; m++)
            for (int v = 0; v < 2; v++) l32[m][v] = _mm256_setzero_si256();
        const int k1 = (g + 1) * KG < K4 ? (g + 1) * KG : K4;
        for (int c = g * KG; c < k1; c += SUM16) {
            const int c1 = c + SUM16 < k1 ? c + SUM16 : k1;
            __m256i a16[MBA][2], l16[MBF][2];
            for (int m = 0; m < MBA; m++)
                for (int v = 0; v < 2; v++) a16[m][v] = _mm256_setzero_si256();
            for (int m = 0; m < MBF; m++)
                for (int v = 0; v < 2; v++) l16[m][v] = _mm256_setzero_si256();
            for (int k = c; k < c1; k++) {
                __m256i packed = _mm256_loadu_si256((const __m256i *)(w + (size_t)k * 32));
                __m256i c0 = _mm256_and_si256(packed, nib);
                __m256i cc1 = _mm256_and_si256(_mm256_srli_epi16(packed, 4), nib);
                dot_step_i4avx2(xq, stride, Ip, k, c0, cc1, a16, l16, mb, two);
            }
            for (int m = 0; m < MBA; m++) {
                if (m < mb) {
                    for (int v = 0; v < 2; v++) {
                        a32[m][v] = _mm256_add_epi32(a32[m][v], _mm256_madd_epi16(a16[m][v], ones));
                        if (two && m < MBF) l32[m][v] = _mm256_add_epi32(l32[m][v], _mm256_madd_epi16(l16[m][v], ones));
                    }
                }
            }
        }
        for (int m = 0; m < MBA; m++) {
            if (m < mb) {
                __m256 sx = _mm256_set1_ps(xs[m]), xg = _mm256_set1_ps(xsum[(size_t)m * groups + g]);
                for (int v = 0; v < 2; v++) {
                    __m256i d = a32[m][v];
                    if (two && m < MBF) d = _mm256_add_epi32(_mm256_slli_epi32(d, 7), l32[m][v]);
                    __m256 r = _mm256_mul_ps(_mm256_cvtepi32_ps(d), sx);
                    acc[m][v] = _mm256_fmadd_ps(r, _mm256_loadu_ps(gs + (size_t)g * TA + v * 8), acc[m][v]);
                    acc[m][v] = _mm256_fmadd_ps(_mm256_loadu_ps(gz + (size_t)g * TA + v * 8), xg, acc[m][v]);
                }
            }
        }
    }
    float out[TA];
    for (int m = 0; m < MBA; m++) {
        if (m < mb) {
            _mm256_storeu_ps(out, acc[m][0]);
            _mm256_storeu_ps(out + 8, acc[m][1]);
            for (int j = 0; j < nout; j++) y[(size_t)m * O + j] = bias ? out[j] + bias[j] : out[j];
        }
    }
}

#define ROWSA(n, TWO) case n: tile_rows_i4avx2(xm, wt, xsm, xsumm, gst, gzt, bt, yt, n, K4, G, groups, O, nout, TWO); break;

/* y [M, O] = x [M, I] @ W.T (+ bias [O]) with the 4-bit W above; xq [M, 2 * ceil(I / 4) * 4]
   bytes, xs [M] and xsum [M, groups] floats are the caller's scratch. */
void selfspec_native_linear_i4avx2(const float *x, const unsigned char *panels, const float *gscale,
                                   const float *gzero, int G, const float *bias, float *y, signed char *xq,
                                   float *xs, float *xsum, int M, int O, int I, int threads) {
    const int K4 = (I + 3) / 4, groups = (I + G - 1) / G, two = M <= MBF, block = two ? MBF : MBA;
    const size_t stride = (size_t)(two ? 2 : 1) * K4 * 4;
    int tiles = (O + TA - 1) / TA;
    (void)threads;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int m = 0; m < M; m++) prepare_row_i4avx2(x, xq, xs, xsum, m, I, K4 * 4, G, groups, two);
#pragma omp for schedule(static)
        for (int t = 0; t < tiles; t++) {
            int nout = O - t * TA < TA ? O - t * TA : TA;
            const unsigned char *wt = panels + (size_t)t * K4 * 32;
            const float *gst = gscale + (size_t)t * groups * TA, *gzt = gzero + (size_t)t * groups * TA;
            const float *bt = bias ? bias + (size_t)t * TA : NULL;
            for (int m0 = 0; m0 < M; m0 += block) {
                const signed char *xm = xq + (size_t)m0 * stride;
                const float *xsm = xs + m0, *xsumm = xsum + (size_t)m0 * groups;
                float *yt = y + (size_t)m0 * O + (size_t)t * TA;
                int mb = M - m0 < block ? M - m0 : block;
                if (two) {
                    switch (mb) { ROWSA(1, 1) ROWSA(2, 1) default: break; }
                } else {
                    switch (mb) { ROWSA(1, 0) ROWSA(2, 0) ROWSA(3, 0) ROWSA(4, 0) default: break; }
                }
            }
        }
    }
}
#else
void selfspec_native_linear_i4avx2(const float *x, const unsigned char *panels, const float *gscale,
                                   const float *gzero, int G, const float *bias, float *y, signed char *xq,
                                   float *xs, float *xsum, int M, int O, int I, int threads) {
    (void)x, (void)panels, (void)gscale, (void)gzero, (void)G, (void)bias, (void)y, (void)xq, (void)xs, (void)xsum,
        (void)M, (void)O, (void)I, (void)threads; /* never called: selfspec_native_i4avx2() is 0 */
}
#endif

/* ---- int8 weights by int8 products (VNNI): the "int8vnni" draft weights -------------------
   W = q * scale[:, None] as in selfspec_native_linear_int8, but each product is an integer dot
   product of four bytes (vpdpbusd) instead of float multiply-adds, so a block of rows costs
   about what one row costs. The activations are rounded per row:
   - products of up to MBW (2) rows: to 16-bit integers, xq = round(x / s), s = max|x| / 32767,
     split into bytes xq = 256 * hi + lo (hi + 128 and lo unsigned), two dot products per
     weight: y = s * scale * (256 * (sum (hi + 128) q - 128 * sum q) + sum lo q);
   - wider products (where two dot products per weight and row would bound the time, as from 3
     rows on the Zen 4 measured): to 8-bit integers,
     s = max|x| / 127, one dot product: y = s * scale * (sum (xq + 128) q - 128 * sum q).
   Every sum is exact in int32 (|sum| <= 255 * 127 * I, below 2^31 for I < 66000), so a row's
   result depends on its own values and on the product's width only (which of the two). The
   panels hold four consecutive inputs of an output per 32-bit lane, [tiles, ceil(I / 4), TV, 4]
   bytes (padding inputs and rows 0); colsum [tiles * TV] holds the sums of q per output row.
   Compiled only where the target has AVX-512 VNNI: selfspec_native_vnni() says whether it was. */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define HAS_VNNI 1
#else
#define HAS_VNNI 0
#endif
int selfspec_native_vnni(void) { return HAS_VNNI; }
#define TV 32 /* outputs per panel (VNNI_TILE in panels.py) */
int selfspec_native_vnni_tile(void) { return TV; }
#ifndef MBW
#define MBW 2 /* rows computed with 16-bit activations, and their block (VNNI_FINE_ROWS in panels.py) */
#endif
int selfspec_native_vnni_fine(void) { return MBW; }

#if HAS_VNNI
#define MBN 8 /* the block of the wider products (8-bit activations) */

/* Each row of x [M, I] rounded to integers of its own scale xs[m] = max|x| / top: two bytes per
   value (hi + 128, then lo; rows of 2 * Ip bytes) with two, else one (xq + 128; rows of Ip). */
static void quantize_rows_vnni(const float *x, unsigned char *xq, float *xs, int M, int I, int two) {
    const int Ip = (I + 3) / 4 * 4;
    const size_t stride = (size_t)(two ? 2 : 1) * Ip;
    const float top = two ? 32767.0f : 127.0f;
    for (int m = 0; m < M; m++) {
        const float *xr = x + (size_t)m * I;
        float amax = 0.0f;
        for (int i = 0; i < I; i++) amax = __builtin_fabsf(xr[i]) > amax ? __builtin_fabsf(xr[i]) : amax;
        float s = amax > 0.0f ? amax / top : 1.0f, inv = 1.0f / s;
        unsigned char *hi = xq + (size_t)m * stride, *lo = hi + Ip;
        for (int i = 0; i < Ip; i++) {
            float v = i < I ? xr[i] * inv : 0.0f;
            int q = (int)(v + (v >= 0.0f ? 0.5f : -0.5f)); /* to nearest, ties away from zero */
            q = q > (int)top ? (int)top : (q < -(int)top ? -(int)top : q);
            if (two) {
                hi[i] = (unsigned char)((q >> 8) + 128);
                lo[i] = (unsigned char)(q & 255);
            } else {
                hi[i] = (unsigned char)(q + 128);
            }
        }
        xs[m] = s;
    }
}

/* One step of four inputs for a block's mb rows (rows: the block's most): the dot products of
   the 32 outputs' weights w0, w1 with each row's activation bytes (xq rows of stride bytes, the
   high or only bytes first, the low bytes K4 * 4 after them), into ah and, with two, al. */
static inline __attribute__((always_inline)) void dot_step(const unsigned char *xq, size_t stride, int K4, int k,
                                                            __m512i w0, __m512i w1, __m512i ah[][2], __m512i al[][2],
                                                            int mb, int rows, int two) {
    for (int m = 0; m < rows; m++) {
        if (m < mb) {
            int h4;
            __builtin_memcpy(&h4, xq + (size_t)m * stride + (size_t)k * 4, 4);
            __m512i hb = _mm512_set1_epi32(h4);
            ah[m][0] = _mm512_dpbusd_epi32(ah[m][0], hb, w0);
            ah[m][1] = _mm512_dpbusd_epi32(ah[m][1], hb, w1);
            if (two && m < MBW) {
                int l4;
                __builtin_memcpy(&l4, xq + (size_t)m * stride + (size_t)K4 * 4 + (size_t)k * 4, 4);
                __m512i lb = _mm512_set1_epi32(l4);
                al[m][0] = _mm512_dpbusd_epi32(al[m][0], lb, w0);
                al[m][1] = _mm512_dpbusd_epi32(al[m][1], lb, w1);
            }
        }
    }
}

static inline __attribute__((always_inline)) void tile_rows_vnni(const unsigned char *xq, const signed char *w,
                                                                  const float *xs, const float *scale,
                                                                  const int *colsum, const float *bias, float *y,
                                                                  int mb, int K4, int O, int nout, int two) {
    const size_t stride = (size_t)(two ? 2 : 1) * K4 * 4; /* bytes per row of xq */
    __m512i ah[MBN][2], al[MBW][2];
    for (int m = 0; m < MBN; m++)
        for (int v = 0; v < 2; v++) ah[m][v] = _mm512_setzero_si512();
    for (int m = 0; m < MBW; m++)
        for (int v = 0; v < 2; v++) al[m][v] = _mm512_setzero_si512();
    for (int k = 0; k < K4; k++) {
        __m512i w0 = _mm512_loadu_si512((const void *)(w + (size_t)k * TV * 4));
        __m512i w1 = _mm512_loadu_si512((const void *)(w + (size_t)k * TV * 4 + 64));
        dot_step(xq, stride, K4, k, w0, w1, ah, al, mb, MBN, two);
    }
    float out[TV];
    for (int m = 0; m < mb; m++) {
        for (int v = 0; v < 2; v++) {
            __m512i corr = _mm512_slli_epi32(_mm512_loadu_si512((const void *)(colsum + v * 16)), 7);
            __m512 r = _mm512_cvtepi32_ps(_mm512_sub_epi32(ah[m][v], corr));
            if (two && m < MBW) r = _mm512_fmadd_ps(r, _mm512_set1_ps(256.0f), _mm512_cvtepi32_ps(al[m][v]));
            r = _mm512_mul_ps(r, _mm512_mul_ps(_mm512_loadu_ps(scale + v * 16), _mm512_set1_ps(xs[m])));
            _mm512_storeu_ps(out + v * 16, r);
        }
        for (int j = 0; j < nout; j++) y[(size_t)m * O + j] = bias ? out[j] + bias[j] : out[j];
    }
}

#define ROWSV(n, TWO) case n: tile_rows_vnni(xm, wt, xsm, st, ct, bt, yt, n, K4, O, nout, TWO); break;

/* y [M, O] = x [M, I] @ W.T (+ bias [O]) with W = q * scale[:, None], q as VNNI panels and
   colsum as above; xq [M, 2 * ceil(I / 4) * 4] bytes and xs [M] floats are the caller's scratch. */
void selfspec_native_linear_i8vnni(const float *x, const signed char *panels, const float *scale, const int *colsum,
                                   const float *bias, float *y, unsigned char *xq, float *xs, int M, int O, int I,
                                   int threads) {
    const int K4 = (I + 3) / 4, Ip = K4 * 4, two = M <= MBW, block = two ? MBW : MBN;
    const size_t stride = (size_t)(two ? 2 : 1) * Ip;
    quantize_rows_vnni(x, xq, xs, M, I, two);
    int tiles = (O + TV - 1) / TV;
    (void)threads;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int t = 0; t < tiles; t++) {
        int nout = O - t * TV < TV ? O - t * TV : TV;
        const signed char *wt = panels + (size_t)t * K4 * TV * 4;
        const float *st = scale + (size_t)t * TV;
        const int *ct = colsum + (size_t)t * TV;
        const float *bt = bias ? bias + (size_t)t * TV : NULL;
        for (int m0 = 0; m0 < M; m0 += block) {
            const unsigned char *xm = xq + (size_t)m0 * stride;
            const float *xsm = xs + m0;
            float *yt = y + (size_t)m0 * O + (size_t)t * TV;
            int mb = M - m0 < block ? M - m0 : block;
            if (two) {
                switch (mb) { ROWSV(1, 1) ROWSV(2, 1) ROWSV(3, 1) ROWSV(4, 1) default: break; }
            } else {
                switch (mb) {
                    ROWSV(1, 0) ROWSV(2, 0) ROWSV(3, 0) ROWSV(4, 0) ROWSV(5, 0) ROWSV(6, 0) ROWSV(7, 0) ROWSV(8, 0)
                    default: break;
                }
            }
        }
    }
}

/* ---- 4-bit weights by int8 products (VNNI): the "int4vnni" draft weights ------------------
   W[o, i] = code[o, i] * gscale[o, g] + gzero[o, g] for g = i / G (the int4native weights), the
   activations rounded per row as above (16-bit up to MBW rows, 8-bit beyond). Per group, the
   codes (0..15, valid signed bytes) are dotted with the activation bytes exactly in int32, then
   scaled: y = s * sum_g gscale * sum_{i in g} code * xq + sum_g gzero * sum_{i in g} x, with
   sum code * xq = 256 * (sum code * (hi + 128) - 128 * gsum) + sum code * lo (16-bit) or
   sum code * (xq + 128) - 128 * gsum (8-bit), gsum the group's sum of codes per output row.
   Panels: per tile and four consecutive inputs, 64 bytes whose low nibbles are outputs 0..15's
   four codes (one 32-bit lane each) and whose high nibbles are outputs 16..31's:
   [tiles, ceil(I / 4), 16, 4] bytes; gscale, gzero [tiles, groups, TV] float, gsum
   [tiles, groups, TV] int32; G a multiple of 4. */
#define MB4N 6 /* the block of the wider 4-bit products */

static inline __attribute__((always_inline)) void tile_rows_i4vnni(const unsigned char *xq, const unsigned char *w,
                                                                    const float *xs, const float *xsum,
                                                                    const float *gs, const float *gz, const int *gsum,
                                                                    const float *bias, float *y, int mb, int K4,
                                                                    int G, int groups, int O, int nout, int two) {
    const size_t stride = (size_t)(two ? 2 : 1) * K4 * 4;
    const __m512i nib = _mm512_set1_epi8(15);
    __m512 acc[MB4N][2];
    for (int m = 0; m < MB4N; m++)
        for (int v = 0; v < 2; v++) acc[m][v] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g++) {
        __m512i ah[MB4N][2], al[MBW][2];
        for (int m = 0; m < MB4N; m++)
            for (int v = 0; v < 2; v++) ah[m][v] = _mm512_setzero_si512();
        for (int m = 0; m < MBW; m++)
            for (int v = 0; v < 2; v++) al[m][v] = _mm512_setzero_si512();
        const int k1 = (g + 1) * (G / 4) < K4 ? (g + 1) * (G / 4) : K4;
        for (int k = g * (G / 4); k < k1; k++) {
            __m512i packed = _mm512_loadu_si512((const void *)(w + (size_t)k * 64));
            __m512i w0 = _mm512_and_si512(packed, nib);
            __m512i w1 = _mm512_and_si512(_mm512_srli_epi16(packed, 4), nib);
            dot_step(xq, stride, K4, k, w0, w1, ah, al, mb, MB4N, two);
        }
        for (int m = 0; m < mb; m++) {
            for (int v = 0; v < 2; v++) {
                __m512i corr = _mm512_slli_epi32(_mm512_loadu_si512((const void *)(gsum + (size_t)g * TV + v * 16)), 7);
                __m512 r = _mm512_cvtepi32_ps(_mm512_sub_epi32(ah[m][v], corr));
                if (two && m < MBW) r = _mm512_fmadd_ps(r, _mm512_set1_ps(256.0f), _mm512_cvtepi32_ps(al[m][v]));
                r = _mm512_mul_ps(r, _mm512_set1_ps(xs[m]));
                acc[m][v] = _mm512_fmadd_ps(r, _mm512_loadu_ps(gs + (size_t)g * TV + v * 16), acc[m][v]);
                acc[m][v] = _mm512_fmadd_ps(_mm512_loadu_ps(gz + (size_t)g * TV + v * 16),
                                            _mm512_set1_ps(xsum[(size_t)m * groups + g]), acc[m][v]);
            }
        }
    }
    float out[TV];
    for (int m = 0; m < mb; m++) {
        for (int v = 0; v < 2; v++) _mm512_storeu_ps(out + v * 16, acc[m][v]);
        for (int j = 0; j < nout; j++) y[(size_t)m * O + j] = bias ? out[j] + bias[j] : out[j];
    }
}

#define ROWS4V(n, TWO) case n: tile_rows_i4vnni(xm, wt, xsm, xsumm, gst, gzt, gct, bt, yt, n, K4, G, groups, O, nout, TWO); break;

/* y [M, O] = x [M, I] @ W.T (+ bias [O]) with the 4-bit W above; xq [M, 2 * ceil(I / 4) * 4]
   bytes, xs [M] and xsum [M, groups] floats are the caller's scratch. */
void selfspec_native_linear_i4vnni(const float *x, const unsigned char *panels, const float *gscale,
                                   const float *gzero, const int *gsum, int G, const float *bias, float *y,
                                   unsigned char *xq, float *xs, float *xsum, int M, int O, int I, int threads) {
    const int K4 = (I + 3) / 4, two = M <= MBW, block = two ? MBW : MB4N, groups = (I + G - 1) / G;
    const size_t stride = (size_t)(two ? 2 : 1) * K4 * 4;
    quantize_rows_vnni(x, xq, xs, M, I, two);
    group_sums(x, xsum, M, I, G);
    int tiles = (O + TV - 1) / TV;
    (void)threads;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int t = 0; t < tiles; t++) {
        int nout = O - t * TV < TV ? O - t * TV : TV;
        const unsigned char *wt = panels + (size_t)t * K4 * 64;
        const float *gst = gscale + (size_t)t * groups * TV, *gzt = gzero + (size_t)t * groups * TV;
        const int *gct = gsum + (size_t)t * groups * TV;
        const float *bt = bias ? bias + (size_t)t * TV : NULL;
        for (int m0 = 0; m0 < M; m0 += block) {
            const unsigned char *xm = xq + (size_t)m0 * stride;
            const float *xsm = xs + m0, *xsumm = xsum + (size_t)m0 * groups;
            float *yt = y + (size_t)m0 * O + (size_t)t * TV;
            int mb = M - m0 < block ? M - m0 : block;
            if (two) {
                switch (mb) { ROWS4V(1, 1) ROWS4V(2, 1) default: break; }
            } else {
                switch (mb) { ROWS4V(1, 0) ROWS4V(2, 0) ROWS4V(3, 0) ROWS4V(4, 0) ROWS4V(5, 0) ROWS4V(6, 0) default: break; }
            }
        }
    }
}
#else
void selfspec_native_linear_i8vnni(const float *x, const signed char *panels, const float *scale, const int *colsum,
                                   const float *bias, float *y, unsigned char *xq, float *xs, int M, int O, int I,
                                   int threads) {
    (void)x, (void)panels, (void)scale, (void)colsum, (void)bias, (void)y, (void)xq, (void)xs, (void)M, (void)O,
        (void)I, (void)threads; /* never called: selfspec_native_vnni() is 0 */
}
void selfspec_native_linear_i4vnni(const float *x, const unsigned char *panels, const float *gscale,
                                   const float *gzero, const int *gsum, int G, const float *bias, float *y,
                                   unsigned char *xq, float *xs, float *xsum, int M, int O, int I, int threads) {
    (void)x, (void)panels, (void)gscale, (void)gzero, (void)gsum, (void)G, (void)bias, (void)y, (void)xq, (void)xs,
        (void)xsum, (void)M, (void)O, (void)I, (void)threads; /* never called: selfspec_native_vnni() is 0 */
}
#endif

/* ---- building the copies: rearrangements and quantization, threads over tiles or rows ------
   What the runner and the draft weights do once per weight when they are built. Each writes
   what the torch code in panels.py and draftweights/quantize.py writes, bitwise (a rearrangement; the
   quantizer with the same IEEE float32 operations in the same order), in one pass and on
   every thread, where torch's strided copies and chains of whole-tensor operations take
   several passes, each into new memory. */

/* panels [tiles, I, W] of w [O, I] (float32): panels[t][i][j] = w[t * W + j][i], zero past row O. */
void selfspec_native_to_panels(const float *w, float *panels, int O, int I, int W, int threads) {
    const int tiles = (O + W - 1) / W;
    (void)threads;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int t = 0; t < tiles; t++) {
        float *p = panels + (size_t)t * I * W;
        const float *wt = w + (size_t)t * W * I;
        const int n = O - t * W < W ? O - t * W : W;
        for (int i = 0; i < I; i++) {
            for (int j = 0; j < n; j++) p[(size_t)i * W + j] = wt[(size_t)j * I + i];
            for (int j = n; j < W; j++) p[(size_t)i * W + j] = 0.0f;
        }
    }
}

/* w [rows, I] (float32, rows at most the panels' rows) from panels [tiles, I, W]:
   w[o][i] = panels[o / W][i][o % W]. */
void selfspec_native_from_panels(const float *panels, float *w, int rows, int I, int W, int threads) {
    const int tiles = (rows + W - 1) / W;
    (void)threads;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int t = 0; t < tiles; t++) {
        const float *p = panels + (size_t)t * I * W;
        float *wt = w + (size_t)t * W * I;
        const int n = rows - t * W < W ? rows - t * W : W;
        for (int i = 0; i < I; i++)
            for (int j = 0; j < n; j++) wt[(size_t)j * I + i] = p[(size_t)i * W + j];
    }
}

/* A group's minimum lo and step s = max((hi - lo) / 15, 1e-12), and a weight's code
   min(max(round_half_even((w - lo) / s), 0), 15): the operations of quantize_groups in torch. */
static inline unsigned char code_of(float w, float lo, float s) {
    float c = __builtin_nearbyintf((w - lo) / s);
    c = c < 0.0f ? 0.0f : c;
    c = c > 15.0f ? 15.0f : c;
    return (unsigned char)c;
}

static inline void group_bounds(const float *wr, int i0, int i1, float *lo_out, float *s_out) {
    float lo = wr[i0], hi = wr[i0];
    for (int i = i0 + 1; i < i1; i++) {
        lo = wr[i] < lo ? wr[i] : lo;
        hi = wr[i] > hi ? wr[i] : hi;
    }
    float s = (hi - lo) / 15.0f;
    *lo_out = lo;
    *s_out = s < 1e-12f ? 1e-12f : s;
}

/* 4-bit codes of w [O, I] (float32) per row and group of G inputs, as quantize_groups computes
   them: lo and hi the group's minimum and maximum, s = max((hi - lo) / 15, 1e-12),
   code = min(max(round_half_even((w - lo) / s), 0), 15). codes [O, I] uint8; scale and
   offset (lo) [O, ceil(I / G)] float32. */
void selfspec_native_quantize_groups(const float *w, unsigned char *codes, float *scale, float *offset, int O, int I,
                                     int G, int threads) {
    const int groups = (I + G - 1) / G;
    (void)threads;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int o = 0; o < O; o++) {
        const float *wr = w + (size_t)o * I;
        unsigned char *cr = codes + (size_t)o * I;
        for (int g = 0; g < groups; g++) {
            const int i0 = g * G, i1 = i0 + G < I ? i0 + G : I;
            float lo, s;
            group_bounds(wr, i0, i1, &lo, &s);
            scale[(size_t)o * groups + g] = s;
            offset[(size_t)o * groups + g] = lo;
            for (int i = i0; i < i1; i++) cr[i] = code_of(wr[i], lo, s);
        }
    }
}

/* quantize_groups and to_int4_quad_panels in one pass, without the codes in between: the 4-bit
   panels [tiles, ceil(I / 4), tile / 2, 4] of w [O, I] (float32) quantized per row and group of
   G inputs, and the rows' scale and offset [O, ceil(I / G)]; bitwise what the two passes write.
   Per tile and group: each row's bounds and codes (a contiguous, vectorized loop into a small
   buffer), then the group's bytes in order. Returns -1 (nothing written) where G is not a
   multiple of 4 (a byte's four inputs would straddle groups) or a tile's group of codes
   outgrows the buffer; the caller then runs the two passes. */
#define QUAD_CODES_MAX 16384
int selfspec_native_quantize_int4_quad(const float *w, unsigned char *panels, float *scale, float *offset, int O,
                                       int I, int G, int tile, int threads) {
    const int groups = (I + G - 1) / G, tiles = (O + tile - 1) / tile, k4 = (I + 3) / 4, half = tile / 2;
    if (G % 4 || (size_t)tile * G > QUAD_CODES_MAX) return -1;
    (void)threads;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int t = 0; t < tiles; t++) {
        unsigned char codes[QUAD_CODES_MAX]; /* [tile, G]: one group's codes of the tile's rows */
        unsigned char *pt = panels + (size_t)t * k4 * half * 4;
        for (int g = 0; g < groups; g++) {
            const int i0 = g * G, i1 = i0 + G < I ? i0 + G : I, n = i1 - i0;
            for (int r = 0; r < tile; r++) {
                const int o = t * tile + r;
                unsigned char *cr = codes + (size_t)r * G;
                if (o >= O) {
                    for (int i = 0; i < (n + 3) / 4 * 4; i++) cr[i] = 0; /* padding rows */
                    continue;
                }
                const float *wr = w + (size_t)o * I + i0;
                float lo, st;
                group_bounds(wr, 0, n, &lo, &st);
                scale[(size_t)o * groups + g] = st;
                offset[(size_t)o * groups + g] = lo;
                for (int i = 0; i < n; i++) cr[i] = code_of(wr[i], lo, st);
                for (int i = n; i < (n + 3) / 4 * 4; i++) cr[i] = 0; /* padding inputs */
            }
            /* a byte's two codes are at most 15, so four bytes pack as one word: lo | hi << 4 */
            for (int q = 0; q < (n + 3) / 4; q++)
                for (int j = 0; j < half; j++) {
                    unsigned lo, hi;
                    __builtin_memcpy(&lo, codes + (size_t)j * G + 4 * q, 4);
                    __builtin_memcpy(&hi, codes + (size_t)(j + half) * G + 4 * q, 4);
                    lo |= hi << 4;
                    __builtin_memcpy(pt + ((size_t)(i0 / 4 + q) * half + j) * 4, &lo, 4);
                }
        }
    }
    return 0;
}
