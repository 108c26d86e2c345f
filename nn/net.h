// net.h: a sequential network built from the cfg, with its memory planned and allocated
// once (DESIGN.md decision 2).
//
// net_create infers every shape, computes the plan, and allocates one block per category
// on the device: parameters, gradients, optimizer state, buffers (batchnorm statistics),
// activations (+ labels and metrics), workspace. Nothing is allocated after that; forward
// and backward only use these blocks.
//
// The network is a sequence of top-level layers; a container (a residual block) is one of
// them and owns inner layers (DESIGN.md decision 11). `modules` lists every layer, inner
// ones included, in state_dict order: parameters, buffers and checkpoints follow it.
#ifndef NN_NET_H
#define NN_NET_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "cfg.h"
#include "exec.h"
#include "kernels.h"
#include "layer.h"

// Bytes per category. `loader` is filled in by the trainer (the data side plans it);
// `threads` is what the backend keeps per compute thread outside the blocks
// (Kernels.thread_scratch: the CPU's GEMM packing buffers).
typedef struct MemPlan {
    size_t params, grads, optimizer, buffers, activations, workspace, threads, loader;
    // The gradient block without the fused update: every trained parameter's gradient.
    // Equal to `grads` unless NetOptions.fused_update, where `grads` is the largest
    // trained module's.
    size_t grads_unfused;
    // Of `activations`: the bytes live at the loss, what forward keeps for backward: the
    // input and labels, every output that a backward reads (with checkpointing, each
    // segment's last and the last segment's), the inner activations, the output, dlogp.
    size_t act_kept;
} MemPlan;

size_t mem_plan_total(const MemPlan *p);
// The blocks the network allocates through its kernel table (all but threads and loader,
// which stay in host memory): what a GPU holds of the plan.
size_t mem_plan_blocks(const MemPlan *p);
// What the plan takes of the memory of device k: the total where the device's memory is
// the host's (the CPU), the blocks elsewhere.
size_t mem_plan_on(const MemPlan *p, const Kernels *k);

// How the network is built and stored.
typedef struct NetOptions {
    int batch;        // the largest N that forward/backward accept (the micro-batch)
    DType precision;  // DT_F32, or DT_F16: activations and their gradients stored as IEEE
                      // halves, computed in fp32 (DESIGN.md decision 4)
    int segments;     // activation checkpointing (decision 6): 0 or 1 = none; S > 1 splits
                      // the layers into S segments; NET_SEGMENTS_SQRT = round(sqrt(layers))
    bool plan_only;   // compute net->plan and allocate nothing (./train --plan)
    bool tf32;        // GEMM inputs rounded to 10 mantissa bits in fp32 too (Kernels.gemm_reduced)
    // Optimizer state tensors kept per trained parameter (optim_nstates) and their names.
    int opt_states;
    const char *const *opt_state_names;
    // Layers whose parameters stay fixed: names, or module paths above them ("layer1").
    // They get no gradient and no optimizer memory; with freeze_stats their batchnorms
    // normalise by the running statistics, which do not move (evaluation mode).
    const char *const *freeze;
    int nfreeze;
    bool freeze_stats;
    // The fused optimizer update (fp32 only; the trainer allows it with accumulate = 1):
    // each trained module is updated during backward, through Net.hook, as soon as its
    // gradients are complete and nothing later in the step reads its parameters; the
    // gradient block holds one module's gradients at a time (the largest module's), which
    // the hook zeroes after the update for the next module's backward.
    bool fused_update;
} NetOptions;

#define NET_SEGMENTS_SQRT (-1)

enum { NET_LOSS, NET_CORRECT, NET_METRICS };

// The step's schedule: every layer's forward (events 0 .. nlayers - 1), the loss (event
// nlayers), then backward: per segment from the last, the recomputation of its layers
// (checkpointing) and the backward of each.
typedef enum EventKind { EV_FORWARD, EV_LOSS, EV_RECOMPUTE, EV_BACKWARD } EventKind;
typedef struct Event {
    EventKind kind;
    int layer;
} Event;

// A buffer of the activation block (the input, a layer's output or inner activations, an
// input gradient, ...) holds something over spans of events [from, to] (nevents: after
// the step); buffers live at the same event never overlap, others may (nn/net.c).
typedef struct ActSpan {
    int from, to;
} ActSpan;
typedef struct ActBuffer {
    size_t offset, bytes;  // in the activation block; bytes 0: not used
    int span0, nspans;     // its spans: spans[span0 .. span0 + nspans)
} ActBuffer;

typedef struct Net {
    const Kernels *k;
    Layer **layers;  // the top-level layers: host structs whose tensors point into the blocks
    int nlayers;
    Layer **modules;  // every layer, containers' children after their container (pre-order)
    int nmodules;
    Shape input;
    int batch;        // the largest N that forward/backward accept
    DType precision;  // of activations and activation gradients (the output is always F32)
    bool gemm_reduced;  // Kernels.gemm_reduced during forward and backward: fp16 or tf32
    int nsegments;    // checkpoint segments (1: none)
    int *seg_first;   // (nsegments + 1): segment s is layers seg_first[s] .. seg_first[s+1]-1
    Exec exec;        // precision, the fp16 chunk and scratch
    size_t scratch_bytes;  // the fp16 scratch at the start of the workspace block
    int64_t nparams;  // scalars in all parameter tensors
    int64_t ntrain;   // of them, in trained (not frozen) tensors
    int nstates;      // optimizer state tensors per trained parameter
    const char *const *state_names;  // their names ("square_avg", ...)
    int first_trained;  // the first top-level layer with a trained parameter: backward
                        // stops there (nlayers when everything is frozen)
    int ntrained_modules;  // modules that train (layer_trains): the hook's calls in a step
    bool fused_update;     // NetOptions.fused_update: every trained module's gradients
                           // share the gradient block (Layer.grads)
    // Called by net_backward after each trained module's backward (nn/layer.h); ready NULL:
    // none. The trainer sets it for the fused update; the network never calls the
    // optimizer itself.
    GradHook hook;
    MemPlan plan;
    Event *events;  // the schedule of a step
    int nevents;
    ActBuffer *bufs;  // the activation block's buffers and their spans
    int nbufs;
    ActSpan *spans;
    int nspans;

    // Device blocks (one allocation each) and pointers into them.
    float *params;     // (nparams): every layer's tensors, in layer order
    float *grads;      // the gradient block: (ntrain), the trained tensors' gradients in the
                       // same order; fused_update: (plan.grads / 4), the gradients of the
                       // module being backpropagated, from the start (Layer.grads)
    float *optimizer;  // (nstates * ntrain): state s of the trained parameter at train_off t
                       // is at optimizer[s * ntrain + t] (net_opt_state)
    void *buffers;     // every layer's F32 buffers, then every layer's state
    void *activations;
    void *workspace;        // the fp16 scratch, then layer_workspace
    void *layer_workspace;  // what layers get as LayerCtx.workspace
    float *input_buf;  // (batch, H, W, C) F32: the batch to forward
    void **acts;       // acts[i]: (batch, layers[i]->out) output of layer i, in precision;
                       // the last layer's (the log-probabilities) is F32. Valid while the
                       // schedule has it live: the output after the step, an output that
                       // no backward reads only until the next layer's forward
    void **din;        // din[i]: (batch, layers[i]->in) where layer i's backward writes its
                       // input gradient, in precision (NULL: none; an in-place layer's is
                       // its successor's)
    float *dlogp;        // (batch, classes) F32: the loss gradient
    int32_t *labels;     // (batch)
    float *metrics;      // [NET_METRICS]: summed loss and correct count (nll_loss adds to them)
    ScalerState *scaler; // the loss scaler's state (nn/scaler.h): its scale multiplies the loss
                         // gradient; {scale 1} from net_create, the trainer's with fp16
    // Called as layer i's forward or backward begins (nn/profile.h); NULL: nothing.
    void (*on_layer)(int layer, bool backward);
} Net;

// Builds the layers from the cfg's layer sections (all sections but [train] and [data]),
// plans and allocates for batches of up to opt->batch samples of shape `input`. The last
// layer must be [log_softmax] with `classes` outputs. Errors name the cfg line.
// Batchnorm buffers start as PyTorch's (running_mean 0, running_var 1, no batches).
int net_create(Net *net, const Cfg *cfg, Shape input, int classes, const NetOptions *opt,
               const Kernels *k, Error *err);
void net_free(Net *net);

// PyTorch's default initialisation, bit for bit: weights and biases U(-b, b) as their
// modules' reset_parameters draw them (LayerOps ParamInit), batchnorm weights 1 and biases
// 0; drawn on the host as torch.manual_seed(seed) followed by building the same modules in
// state_dict order draws them (nn/mt19937.h), then uploaded: the same on every device.
int net_init_params(Net *net, uint64_t seed, Error *err);

// Sets every buffer to its start (running_mean 0, running_var 1, num_batches_tracked 0):
// net_create and net_init_params do it.
int net_reset_buffers(Net *net, Error *err);

// Optimizer state s of trained parameter j of module l (its place among the trained scalars,
// wherever its gradient is).
static inline float *net_opt_state(const Net *net, const Layer *l, int j, int s) {
    return net->optimizer + (size_t)s * (size_t)net->ntrain + (size_t)l->train_off[j];
}

// Forward of N samples from net->input_buf; the output (log-probabilities) is
// net->acts[nlayers - 1]. step and sample0 key the dropout masks (see LayerCtx).
void net_forward(Net *net, int N, bool train, uint64_t seed, uint64_t step, int64_t sample0);
static inline float *net_output(const Net *net) { return (float *)net->acts[net->nlayers - 1]; }

// NLL loss of the output against net->labels, mean over `denominator` samples:
// adds to net->metrics and, if grad, writes the output gradient, times the loss scale of
// net->scaler, into dlogp.
void net_loss(Net *net, int N, int denominator, bool grad);

// Backward of N samples from the output gradient in dlogp (net_loss); parameter
// gradients accumulate into net->grads. Same step/sample0 as the forward. With net->hook
// set, it is called after each trained module's backward (GradHook), and the step stops
// calling it after a failure (hook.failed).
void net_backward(Net *net, int N, uint64_t seed, uint64_t step, int64_t sample0);

// Zeroes the gradient block (all of it: every gradient, or with the fused update the slot).
void net_zero_grads(Net *net);
// Zeroes module m's gradients (layer_param_floats(m) from m->grads[0]): with the fused
// update, the hook's last act, so that the next module's backward accumulates into zeros.
void net_zero_module_grads(Net *net, const Layer *m);

// Whether activation buffer b is live at event t (nevents: after the step).
bool net_buffer_live(const Net *net, int b, int t);

// Prints the layer table (name, type, output shape, parameters) and the total.
void net_print(const Net *net, FILE *f);

#endif
