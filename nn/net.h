// net.h: a sequential network built from the cfg, with its memory planned and allocated
// once (DESIGN.md decision 2).
//
// net_create infers every shape, computes the plan, and allocates one block per category
// on the device: parameters, gradients, optimizer state, activations (+ labels and
// metrics), workspace. Nothing is allocated after that; forward and backward only use
// these blocks.
#ifndef NN_NET_H
#define NN_NET_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "cfg.h"
#include "kernels.h"
#include "layer.h"

// Bytes per category. `loader` is filled in by the trainer (the data side plans it).
typedef struct MemPlan {
    size_t params, grads, optimizer, activations, workspace, loader;
} MemPlan;

size_t mem_plan_total(const MemPlan *p);

typedef struct Net {
    const Kernels *k;
    Layer **layers;  // host structs; their tensors point into the device blocks
    int nlayers;
    Shape input;
    int batch;        // the largest N that forward/backward accept
    int64_t nparams;  // scalars in all parameter tensors
    MemPlan plan;

    // Device blocks (one allocation each) and pointers into them.
    float *params;     // (nparams): every layer's tensors, in layer order
    float *grads;      // (nparams): same layout
    float *optimizer;  // (2 * nparams): Adadelta's square_avg then acc_delta
    void *activations;
    void *workspace;
    float *input_buf;  // (batch, H, W, C) the batch to forward
    float **acts;      // acts[i]: (batch, layers[i]->out) output of layer i
    float *grad_buf[2];  // ping-pong input/output gradients, each of the largest activation
    int32_t *labels;     // (batch)
    float *metrics;      // [2]: summed loss, correct count (accumulated by nll_loss)
} Net;

// Builds the layers from the cfg's layer sections (all sections but [train] and [data]),
// plans and allocates for batches of up to `batch` samples of shape `input`. The last
// layer must be [log_softmax] with `classes` outputs. Errors name the cfg line.
int net_create(Net *net, const Cfg *cfg, Shape input, int classes, int batch,
               const Kernels *k, Error *err);
void net_free(Net *net);

// PyTorch's default initialisation: every parameter U(-b, b), b = 1/sqrt(fan_in), drawn
// from the counter-based RNG keyed by (seed, layer, tensor): the same on every device.
int net_init_params(Net *net, uint64_t seed, Error *err);

// The Adadelta state halves of net->optimizer.
static inline float *net_square_avg(const Net *net) { return net->optimizer; }
static inline float *net_acc_delta(const Net *net) { return net->optimizer + net->nparams; }

// Forward of N samples from net->input_buf; the output (log-probabilities) is
// net->acts[nlayers - 1]. step and sample0 key the dropout masks (see LayerCtx).
void net_forward(Net *net, int N, bool train, uint64_t seed, uint64_t step, int64_t sample0);
static inline float *net_output(const Net *net) { return net->acts[net->nlayers - 1]; }

// NLL loss of the output against net->labels, mean over `denominator` samples:
// adds to net->metrics and, if grad, writes the output gradient into grad_buf[0].
void net_loss(Net *net, int N, int denominator, bool grad);

// Backward of N samples from the output gradient in grad_buf[0] (net_loss); parameter
// gradients accumulate into net->grads. Same step/sample0 as the forward.
void net_backward(Net *net, int N, uint64_t seed, uint64_t step, int64_t sample0);

void net_zero_grads(Net *net);

// Prints the layer table (name, type, output shape, parameters) and the total.
void net_print(const Net *net, FILE *f);

#endif
