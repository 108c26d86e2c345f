// test_gemm.c: the CPU GEMM (cpu_kernels()->gemm, with the project's AVX-512 kernels where
// the CPU has them, nn/gemm_avx512.h) against a double-precision reference: every
// transpose, alpha and beta, shapes on both sides of the tiles' and blocks' edges, and
// row strides wider than the matrices.
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "../nn/gemm_avx512.h"
#include "../nn/kernels.h"
#include "testutil.h"

static float *random_floats(size_t n) {
    float *p = malloc(n * sizeof *p);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = (float)(test_urand() * 2 - 1);
    return p;
}

typedef void GemmFn(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                    const float *B, int ldb, float beta, float *C, int ldc);

// C = alpha op(A) op(B) + beta C through fn, checked element by element against double
// sums: within 1e-5 of the sum of the absolute terms (float rounding over K terms).
static void check(GemmFn *fn, int M, int N, int K, bool ta, bool tb, float alpha, float beta,
                  int pad) {
    const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    float *A = random_floats((size_t)(ta ? K : M) * lda + 1);
    float *B = random_floats((size_t)(tb ? N : K) * ldb + 1);
    float *C = random_floats((size_t)M * ldc + 1);
    float *C0 = malloc(((size_t)M * ldc + 1) * sizeof *C0);
    assert_non_null(C0);
    for (size_t i = 0; i < (size_t)M * ldc + 1; i++) C0[i] = C[i];
    fn(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double sum = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                const double a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                const double b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
                sum += a * b, mag += fabs(a * b);
            }
            const double c0 = C0[(size_t)i * ldc + j];
            const double want = alpha * sum + (beta != 0.0f ? beta * c0 : 0.0);
            const double tol = 1e-5 * (fabs(alpha) * mag + fabs(beta * c0)) + 1e-30;
            const double got = C[(size_t)i * ldc + j];
            if (!(fabs(got - want) <= tol))
                fail_msg("%dx%dx%d ta=%d tb=%d alpha=%g beta=%g pad=%d: C[%d][%d] = %.9g, expected %.9g",
                         M, N, K, ta, tb, alpha, beta, pad, i, j, got, want);
        }
    // Nothing outside the M x N part of C is touched.
    for (int i = 0; i < M; i++)
        for (int j = N; j < ldc; j++) assert_true(C[(size_t)i * ldc + j] == C0[(size_t)i * ldc + j]);
    assert_true(C[(size_t)M * ldc] == C0[(size_t)M * ldc]);
    free(A), free(B), free(C), free(C0);
}

static void avx512(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *B, int ldb, float beta, float *C, int ldc) {
    assert_int_equal(gemm_avx512(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc), 0);
}

// cpu_kernels()->gemm has no strides: called only with pad 0.
static void table(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, float beta, float *C, int ldc) {
    cpu_kernels()->gemm(C, A, B, M, N, K, ta, tb, alpha, beta);
}

// Around the micro-tiles (12 x 32 and 24 x 16), the k-block (256), the row block (144)
// and the column block (4096); a ResNet's narrow layers; a short K.
static const int shapes[][3] = {{1, 1, 1},     {11, 31, 3},   {13, 33, 17},  {25, 16, 5},
                                {24, 15, 40},  {12, 32, 256}, {37, 47, 257}, {145, 65, 300},
                                {300, 16, 144}, {20, 4100, 9}, {64, 10, 600}, {7, 144, 16}};

static void test_avx512_kernels(void **state) {
    (void)state;
    if (!gemm_avx512_available()) {
        printf("this CPU has no AVX-512: gemm_avx512 is not used here, nothing to test\n");
        return;
    }
    test_rng_seed(1);
    static const float ab[][2] = {{1.0f, 0.0f}, {1.0f, 1.0f}, {-0.5f, 0.25f}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++)
            for (int j = 0; j < 3; j++)
                check(avx512, shapes[s][0], shapes[s][1], shapes[s][2], t & 1, t >> 1, ab[j][0],
                      ab[j][1], s % 3 == 0 ? 0 : (int)s);
}

// beta = 0 does not read C (the network's buffers start as whatever was there): NaN in C
// must not reach the result.
static void test_beta_zero_ignores_c(void **state) {
    (void)state;
    test_rng_seed(3);
    static const int sizes[][3] = {{13, 33, 17}, {30, 16, 40}, {64, 288, 300}};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const int M = sizes[s][0], N = sizes[s][1], K = sizes[s][2];
        float *A = random_floats((size_t)M * K), *B = random_floats((size_t)K * N);
        float *C = malloc((size_t)M * N * sizeof *C);
        assert_non_null(C);
        for (int i = 0; i < M * N; i++) C[i] = NAN;
        cpu_kernels()->gemm(C, A, B, M, N, K, false, false, 1.0f, 0.0f);
        for (int i = 0; i < M * N; i++)
            if (!isfinite(C[i])) fail_msg("%dx%dx%d: C[%d] = %g with beta = 0", M, N, K, i, C[i]);
        free(A), free(B), free(C);
    }
}

// The table's GEMM over threads' slabs and its split-K path (a small C over a long K).
static void test_cpu_gemm(void **state) {
    (void)state;
    test_rng_seed(2);
    static const int more[][3] = {{3, 9, 5000}, {64, 288, 576}, {1000, 40, 30}, {40, 1000, 30}};
    cpu_set_threads(2);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++) check(table, shapes[s][0], shapes[s][1], shapes[s][2], t & 1, t >> 1, 1.0f, 0.0f, 0);
    for (size_t s = 0; s < sizeof more / sizeof more[0]; s++)
        for (int t = 0; t < 4; t++) check(table, more[s][0], more[s][1], more[s][2], t & 1, t >> 1, -0.5f, 1.0f, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_avx512_kernels),
        cmocka_unit_test(test_cpu_gemm),
        cmocka_unit_test(test_beta_zero_ignores_c),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
