// cpu.c: the CPU backend's table, chosen once per process from the instructions the CPU
// has (issue 36): the AVX2 table (AVX2, FMA, F16C) where the CPU and the OS support
// them, else the portable one, compiled for the build's baseline (plain x86-64, or any
// arm64). Both are nn/cpu_kernels.c; the choice is made at the first call, so one binary
// runs on every CPU of its architecture. CNN_CPU_KERNELS=portable in the environment
// forces the portable table, CNN_CPU_KERNELS=avx2 the AVX2 table without the AVX-512 code
// that it runs where the CPU has that (tests/arch.sh compares each with an emulated CPU
// that has no more).
#include <cblas.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemm_avx512.h"
#include "gemm_bf16.h"
#include "kernels.h"
#include "quant.h"

const char *const activation_names[ACT_COUNT] = {"none", "relu", "relu6"};
static_assert(ACT_COUNT == 3, "activation_names must list every Activation");

extern const Kernels cpu_kernels_portable;
#if defined(__x86_64__)
extern const Kernels cpu_kernels_avx2;
#endif

// Filled here, in the baseline's object, not in the tables': a constructor of the
// AVX2 object would run its instructions before any choice.
float cpu_quant_map[QUANT_MAP_FLOATS];
__attribute__((constructor)) static void cpu_quant_map_init(void) { quant_map_fill(cpu_quant_map); }

static const Kernels *chosen;
static const char *chosen_set;
static bool avx512_allowed;

#if defined(__x86_64__)
// Whether the CPU has AVX2, FMA and F16C (the AVX2 object's -mavx2 -mfma -mf16c) and the
// OS saves the YMM registers (XCR0's SSE and AVX state bits). From cpuid itself: clang's
// __builtin_cpu_supports knows no "f16c".
static bool avx2_usable(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    const unsigned need = bit_FMA | bit_OSXSAVE | bit_AVX | bit_F16C;
    if ((c & need) != need) return false;
    unsigned xcr0, xcr0_high;
    __asm__("xgetbv" : "=a"(xcr0), "=d"(xcr0_high) : "c"(0));
    if ((xcr0 & 6) != 6) return false;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & bit_AVX2);
}
#endif

static pthread_once_t choose_once = PTHREAD_ONCE_INIT;

static void choose(void) {
    const char *want = getenv("CNN_CPU_KERNELS");
    const bool portable = want && strcmp(want, "portable") == 0, avx2 = want && strcmp(want, "avx2") == 0;
    if (want && !portable && !avx2)
        fprintf(stderr, "warning: CNN_CPU_KERNELS=%s: expected 'portable' or 'avx2'; choosing by the CPU\n", want);
    chosen = &cpu_kernels_portable;
    avx512_allowed = !avx2;
#if defined(__x86_64__)
    chosen_set = "x86-64";
    if (!portable && avx2_usable()) {
        chosen = &cpu_kernels_avx2;
        chosen_set = "AVX2";
    } else if (avx2) {
        fprintf(stderr, "warning: CNN_CPU_KERNELS=avx2: this CPU (or its OS) has no AVX2: the x86-64 table\n");
    }
#elif defined(__aarch64__)
    chosen_set = "arm64";
    if (avx2) fprintf(stderr, "warning: CNN_CPU_KERNELS=avx2: not an x86-64 CPU: the arm64 table\n");
#else
    chosen_set = "portable";
#endif
}

const Kernels *cpu_kernels(void) {
    pthread_once(&choose_once, choose);
    return chosen;
}

bool cpu_avx512_allowed(void) {
    pthread_once(&choose_once, choose);
    return avx512_allowed;
}

// Whether the chosen table runs the project's own GEMMs (the fast table's; cpu_kernels.c).
static bool own_gemms(void) {
    pthread_once(&choose_once, choose);
    return chosen != &cpu_kernels_portable;
}

const char *cpu_kernels_name(void) {
    static char name[128];
    pthread_once(&choose_once, choose);
    snprintf(name, sizeof name, "%s loops, %sOpenBLAS %s GEMM", chosen_set,
             own_gemms() && gemm_avx512_available() ? "AVX-512 + " : "", openblas_get_corename());
    return name;
}

const char *cpu_bf16_gemm_name(void) { return own_gemms() ? gemm_bf16_name() : NULL; }

void cpu_set_threads(int n) {
    openblas_set_num_threads(1);  // see cpu_gemm
    omp_set_num_threads(n);
    omp_set_max_active_levels(1);  // a kernel inside a shard runs on the shard's thread
}
