/* Throughput of one vector instruction on this CPU: 8 independent accumulators, each step one
   product (vpmaddubsw, vpmaddwd, vpmullw or vfmadd) and one add, 10^8 steps.
   gcc -O2 -march=native throughput.c -o throughput && ./throughput */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    (void)argv;
    const long N = 100000000;
    __m256i acc[8], w[8];
    for (int i = 0; i < 8; i++) {
        acc[i] = _mm256_setzero_si256();
        w[i] = _mm256_set1_epi8((char)(i + 1));
    }
    __m256i x = _mm256_set1_epi8((char)argc);
    double t = now();
    for (long n = 0; n < N; n++) {
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) acc[i] = _mm256_add_epi16(acc[i], _mm256_maddubs_epi16(w[i], x));
        __asm__ volatile("" : "+x"(x));
    }
    printf("vpmaddubsw ymm: %.2f G/s\n", 8.0 * N / (now() - t) / 1e9);
    t = now();
    for (long n = 0; n < N; n++) {
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(w[i], x));
        __asm__ volatile("" : "+x"(x));
    }
    printf("vpmaddwd ymm: %.2f G/s\n", 8.0 * N / (now() - t) / 1e9);
    __m256 f[8], fb = _mm256_set1_ps(1.0001f), fc = _mm256_set1_ps(0.5f);
    for (int i = 0; i < 8; i++) f[i] = _mm256_set1_ps((float)i);
    t = now();
    for (long n = 0; n < N; n++) {
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) f[i] = _mm256_fmadd_ps(f[i], fb, fc);
        __asm__ volatile("" : "+x"(fb), "+x"(fc));
    }
    printf("vfmadd231ps ymm: %.2f G/s\n", 8.0 * N / (now() - t) / 1e9);
    int s = 0;
    float fs = 0.0f;
    for (int i = 0; i < 8; i++) {
        s += _mm256_extract_epi32(acc[i], 0);
        fs += f[i][0];
    }
    return s == 1 && fs == 1.0f;
}
