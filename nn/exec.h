// exec.h: running layers over stored activations (DESIGN.md decisions 1, 4 and 11).
//
// Activations are stored in the network's precision: F32, or F16 (IEEE halves, half the
// memory). Leaf layers compute in fp32; in F16 the executor runs a leaf over chunks of
// samples, converting each chunk's input (and, in backward, output and output gradient)
// into fp32 scratch and the result back to halves, so layers stay fp32 code. Layers
// with batch passes (batchnorm) get their pass over every chunk first. Containers run
// their children through the same functions (layer_run_* in layer.h).
#ifndef NN_EXEC_H
#define NN_EXEC_H

#include "layer.h"

struct Exec {
    DType precision;      // of stored activations: DT_F32 or DT_F16
    int64_t slot_values;  // F16: fp32 values in each scratch slot
    float *scratch[4];    // F16: slot_values F32 each
};

// Samples per call of leaf l in a pass over N: in F16 as many as a scratch slot holds of
// the larger of its input and output (at least 1, at most N), so a layer with small
// activations runs on large chunks (a GEMM over one sample of a 7x7 layer would pack the
// whole weight for 49 rows); N in F32.
int exec_chunk(const Exec *e, const Layer *l, int N);

// A stored activation: in the executor's precision, or F32 where f32 is set (the
// network's input and its output, the log-probabilities).
typedef struct Stored {
    void *p;
    bool f32;
} Stored;

// Layer l forward over N samples (out from in), and backward (din from dout; din.p NULL
// when nobody needs it); parameter gradients accumulate. After a trained module's
// backward, exec_backward calls ctx->hook (GradHook, nn/layer.h) when it is set.
void exec_forward(const LayerCtx *ctx, Layer *l, Stored out, Stored in, int N);
void exec_backward(const LayerCtx *ctx, Layer *l, Stored din, Stored dout, Stored in, Stored out,
                   int N);

#endif
