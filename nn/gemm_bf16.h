// gemm_bf16.h: a GEMM with bf16 operands and fp32 accumulation for CPUs with AVX512-BF16
// (nn/gemm_bf16.c: AMD Zen 4 and later, Intel Cooper Lake and Sapphire Rapids and later),
// on AMX's tiles where the CPU has them (Intel Sapphire Rapids and later).
//
// The operands are fp32 in memory, as for every other GEMM of the project; packing rounds
// them to bf16 (VCVTNE2PS2BF16: quant.h's bf16_from_float, except that fp32 subnormals
// become zeros, which VDPBF16PS would read as zeros anyway),
// and VDPBF16PS multiplies pairs of them at twice the rate of fp32 FMAs. What PyTorch's
// CPU autocast computes with bf16: the products of bf16 values are exact in fp32, only the
// operands' rounding (8 significant bits) and the fp32 sums round. Row-major,
// single-threaded: cpu_gemm cuts the threads' slabs, as for gemm_avx512.
#ifndef NN_GEMM_BF16_H
#define NN_GEMM_BF16_H

#include <stdbool.h>
#include <stddef.h>

#include "kernels.h"

// Whether this CPU runs gemm_bf16 (AVX-512 F and BW, AVX512_BF16, and the OS saving the
// ZMM registers; and cpu_avx512_allowed: not under CNN_CPU_KERNELS=avx2).
bool gemm_bf16_available(void);

// Which instructions it runs on ("AMX-BF16" where the CPU and the OS allow the tiles,
// else "AVX512-BF16"), NULL where gemm_bf16 does not run.
const char *gemm_bf16_name(void);

// Whether AMX may be used where it can (the default); off runs VDPBF16PS, for the tests
// and benchmarks that compare the two. Call it between products.
void gemm_bf16_allow_amx(bool allow);

// C (M, N; row stride ldc) = alpha * bf16(op(A)) @ bf16(op(B)) + beta * C, with
// cblas_sgemm's row-major arguments (op(A) is (M, K), stored (K, M) when ta; op(B) is
// (K, N), stored (N, K) when tb). Each element of C sums its products over blocks of
// GEMM_BF16_KC values of k, each block's sum added to C in k order. Inside a block, with
// VDPBF16PS: in pairs of k, in k order, for the pair (2p, 2p + 1) acc += a[2p+1] b[2p+1]
// then acc += a[2p] b[2p], each an fp32 addition rounded to nearest even with subnormal
// results flushed to zero. With AMX: in steps of 32 values of k, each step's sum rounded
// as the hardware does it (Intel's pseudo-code does not give it to the bit: measured on a
// Sapphire Rapids, none of the fp32 orders matches it), the same bits for the same inputs;
// and where alpha = 1 and beta is 0 or 1 (every product of the layers), the steps of every
// k-block add to C itself (the tiles are loaded from C and stored back), not a k-block's
// sum rounded on its own (with other alpha or beta: k-blocks of 512).
// Returns -1 where this CPU has no AVX512-BF16 or the packing buffers cannot be allocated.
int gemm_bf16(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc);

// An operand of gemm_bf16_views, or its result: a stored matrix, a convolution's im2col
// columns (never stored: read from the input where the packing needs them), or a
// convolution's weight in PyTorch's layout read in im2col's column order (no permuted
// copy).
typedef enum GemmViewKind { VIEW_STORED, VIEW_COLS, VIEW_WEIGHT } GemmViewKind;
typedef struct GemmView {
    GemmViewKind kind;
    // VIEW_STORED: element (i, j) at x[i * ld + j], or at x[j * ld + i] when trans.
    // VIEW_WEIGHT, always transposed (op(B) = W^T): row i at x + i * ld, its column
    // j = t * C + c (from col0 on, t < taps) at c * cstride + tap0 + t * tstride. A
    // forward's weight (OC, C, K, K): rows the filters, ld = C * K * K, cstride = K * K,
    // tap0 = 0, tstride = 1; the input gradient's (a convolution of dout with the weight
    // turned half a turn, its filters and channels swapped): rows the input channels,
    // ld = K * K, C = OC, cstride = C * K * K, tap0 = K * K - 1, tstride = -1.
    float *x;
    long long ld;
    bool trans;
    int C, taps, col0, cstride, tap0, tstride;
    // VIEW_COLS: the matrix that nn/kernels.h's im2col writes for `in` (batch, H, W, C):
    // a row an output pixel (image, oh, ow), its K * K * C columns ordered (kh, kw, c),
    // zeros where the patch reaches into the padding; from row row0 and column col0 on.
    // Never transposed.
    const float *in;
    int H, W, K, stride, pad, OH, OW;
    long long row0;
} GemmView;

// gemm_bf16 with views: C (M, N) = alpha * bf16(op(A)) @ bf16(op(B)) + beta * C, A stored
// or columns, B stored, columns or a weight, C stored (none transposed but where said).
// The same bits as gemm_bf16 over the columns im2col writes and the weight permuted.
int gemm_bf16_views(int M, int N, int K, float alpha, const GemmView *A, const GemmView *B, float beta,
                    const GemmView *C);

// A 3x3 stride-1 convolution padded by 1 on AMX's tiles, reading the input (N, H, W, C)
// where it lies and rounding each of its values to bf16 once (nn/gemm_bf16.c says how):
// where AMX is usable, C and OC are multiples of 16 and W is at least 16 (a tile's 16
// output pixels lie in one row). Products of bf16 operands in fp32 sums, each output's in
// the same order whatever the call's images are; the weight gradient's sums depend on the
// call's images and the thread count. Weights in PyTorch's layout (OC, C, 3, 3). Each
// returns -1 where a thread's buffer (gemm_thread_buffer) cannot be allocated, else 0.
bool conv_amx_usable(ConvGeometry g);
// out (N, H, W, OC) = the convolution of in.
int conv_amx_forward(float *out, const float *in, const float *w, ConvGeometry g);
// din (N, H, W, C) = the input gradient of dy (N, H, W, OC).
int conv_amx_data_grad(float *din, const float *dy, const float *w, ConvGeometry g);
// dw' (OC, 3, 3, C), in im2col's column order (nn/conv.c's permuted weight), += the weight
// gradient.
int conv_amx_weight_grad(float *dw, const float *dy, const float *in, ConvGeometry g);

#define GEMM_BF16_KC 256

#endif
