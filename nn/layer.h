// layer.h: the layer interface. A layer is written once, for every device: it calls the
// device only through the Kernels table in LayerCtx (DESIGN.md decision 1).
//
// Each layer type has its own small struct that starts with a Layer (so a Layer * can be
// cast to it) and an ops table. The network owns all memory: parameters, gradients,
// buffers, activations and workspace are pointers into its planned blocks (decision 2).
//
// Two kinds of layers:
//   leaves      (conv, batchnorm, relu, ...) compute in fp32: forward and backward get fp32
//               views of their input and output. With fp16 storage the network converts
//               chunks of samples through its scratch around each call (nn/exec.h).
//   containers  (the residual block, decision 11) own inner layers (children) and run them
//               with layer_run_* on stored activations, in the network's precision. To the
//               network a container is one layer: checkpoint segments cut only between
//               top-level layers, and its inner activations are planned as its own.
#ifndef NN_LAYER_H
#define NN_LAYER_H

#include <stdbool.h>
#include <stdint.h>

#include "cfg.h"
#include "kernels.h"
#include "tensor.h"

#define LAYER_MAX_PARAMS 2
#define LAYER_MAX_BUFFERS 3
#define LAYER_NAME_MAX 64

enum { BACKWARD_READS_IN = 1, BACKWARD_READS_OUT = 2 };

typedef struct Exec Exec;  // nn/exec.h
typedef struct Layer Layer;

// What backward calls once a trained module (a layer with parameters, not frozen) is done
// with in the step: its gradients in m->grads are complete (accumulate = 1, fp32) and
// nothing later in the step reads its parameters, so they may be updated and the gradients'
// memory reused (the fused optimizer update, NetOptions.fused_update). It is called after
// the module's backward returns (nn/exec.c): a layer reads its parameters only in its
// forward and backward, the network recomputes a layer only before its backward, and a
// container runs no child's forward after that child's backward (LayerOps.run_backward).
typedef struct GradHook {
    // Returns 0, or -1 to stop the step (arg carries the error): `failed` is set then and
    // ready is not called again.
    int (*ready)(void *arg, Layer *m);
    void *arg;
    bool failed;
} GradHook;

typedef struct LayerCtx {
    const Kernels *k;
    const Exec *exec;  // how stored activations are run (precision, fp16 scratch)
    void *workspace;   // device scratch of at least ops->workspace_bytes(layer, N) bytes
    uint64_t seed;     // run seed: dropout key = rng_key(seed, RNG_STREAM_DROPOUT, step, layer)
    uint64_t step;     // optimizer step (micro-batches of one step share it)
    int64_t sample0;   // index of this micro-batch's first sample within the step's batch
    int n0;            // the first sample of this call within its pass over the micro-batch
                       // (fp16 runs leaves over chunks): where its rows of l->inner begin
    bool train;        // false: dropout is the identity, batchnorm uses running statistics
    bool recompute;    // this forward recomputes a checkpointed segment during backward: it
                       // must give the first forward's outputs, so batchnorm reuses the
                       // batch statistics it saved and its running statistics do not move
    // A pass over the batch in chunks of samples (fp16, nn/exec.h) calls forward or backward
    // once per chunk, in order, with nothing else using the workspace in between:
    bool after_first;  // an earlier chunk of this pass ran: what the layer prepared in the
                       // workspace on the first (conv's permuted weight) is still there
    bool before_last;  // chunks of this pass follow: what the layer finishes on the last
                       // (conv's weight gradient, permuted back) waits for it
    GradHook *hook;    // backward: called after each trained module's backward; NULL: none
} LayerCtx;

// What a layer is made from: its cfg section and the shape of its input.
typedef struct LayerArgs {
    const Cfg *cfg;
    const CfgSection *s;
    Shape in;
    int classes;  // the data's class count (a [linear] with `outputs = classes` takes it)
} LayerArgs;

// How a parameter starts (net_init_params): PyTorch's defaults for its module.
typedef enum ParamInit {
    INIT_WEIGHT,  // kaiming_uniform_(a = sqrt(5)): U(-b, b), b = sqrt(6 / (1 + 5)) / sqrt(fan_in)
    INIT_BIAS,    // U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    INIT_ONES,    // batchnorm's weight
    INIT_ZEROS,   // batchnorm's bias
} ParamInit;

typedef struct LayerOps {
    const char *type;     // the cfg section that makes it: "conv", "linear", ...
    const char *summary;  // one line for --help
    const CfgKey *keys;   // its cfg keys, for validation and --help
    int nkeys;
    // Reads the section's keys, checks them against the input shape and sets up the
    // layer: out shape, parameter and buffer tensors (names, PyTorch shapes; data set
    // later), children.
    int (*create)(Layer **out, const LayerArgs *a, Error *err);
    // Bytes of scratch that forward and backward need for a batch of N on backend k
    // (NULL: none).
    size_t (*workspace_bytes)(const Layer *l, const Kernels *k, int N);
    // Bytes of device state kept from a forward to its backward, independent of the batch
    // (batchnorm's batch statistics): l->state. NULL: none.
    size_t (*state_bytes)(const Layer *l);

    // ---- leaves -----------------------------------------------------------------------
    // out (N, out shape) from in (N, in shape).
    void (*forward)(Layer *l, const LayerCtx *ctx, float *out, const float *in, int N);
    // din from dout; parameter gradients accumulate into l->grads. in and out are the
    // forward's input and output, or NULL where backward_reads leaves them out. din is
    // NULL when nobody needs it (the first layer). dout may be overwritten.
    void (*backward)(Layer *l, const LayerCtx *ctx, float *din, float *dout, const float *in,
                     const float *out, int N);
    // din may be the same buffer as dout (an elementwise backward): the network then saves
    // a gradient buffer by passing the same one.
    bool backward_in_place;
    // Which of in and out backward reads (BACKWARD_READS_IN | BACKWARD_READS_OUT); NULL:
    // both. The network plans an activation that no backward reads to live only until
    // the forward of its consumer, so its memory serves others during backward.
    unsigned (*backward_reads)(const Layer *l);
    // Optional passes over the whole batch, for layers whose output depends on all of it
    // (batchnorm's statistics): called on the chunks [n0, n0 + n) of the N samples in
    // order before forward (backward) runs on any of them; in fp32 the batch is one chunk.
    // forward_reduces says whether forward needs its pass this time (NULL: always).
    bool (*forward_reduces)(const Layer *l, const LayerCtx *ctx);
    void (*forward_reduce)(Layer *l, const LayerCtx *ctx, const float *in, int n0, int n, int N);
    void (*backward_reduce)(Layer *l, const LayerCtx *ctx, const float *dout, const float *in,
                            const float *out, int n0, int n, int N);

    // ---- containers ---------------------------------------------------------------------
    // In place of forward and backward: in, out, din and dout are stored activations in
    // the network's precision (a container is never the first or the last layer). Nothing
    // reads a layer's output after its backward, so run_backward may use out as scratch
    // once it has read it (the residual block recomputes an inner activation there).
    // run_backward runs its children's backward through layer_run_backward, and no
    // child's forward after that child's backward: once a child's backward returns, its
    // parameters may be updated (GradHook).
    void (*run_forward)(Layer *l, const LayerCtx *ctx, void *out, const void *in, int N);
    void (*run_backward)(Layer *l, const LayerCtx *ctx, void *din, void *dout, const void *in,
                         void *out, int N);
    // Stored values per sample of scratch used within one forward or backward: l->scratch,
    // planned by the network to live during the container's own events only.
    int64_t (*scratch_values)(const Layer *l);

    // ---- both ---------------------------------------------------------------------------
    // Bytes per sample kept from forward to backward besides the output (the inner
    // activations of a container, stored in `precision`; max pooling's argmax): l->inner
    // holds batch times that many, sample after sample. NULL: none. Only top-level layers
    // get them from the network.
    size_t (*inner_bytes)(const Layer *l, DType precision);
} LayerOps;

struct Layer {
    const LayerOps *ops;
    char name[LAYER_NAME_MAX];  // PyTorch module path: "conv1", "layer1.0.bn2"
    int index;                  // position among all layers, inner ones included (RNG keys)
    Shape in, out;
    int nparams;                         // parameter tensors (0..LAYER_MAX_PARAMS)
    Tensor params[LAYER_MAX_PARAMS];     // "conv1.weight" (32,1,3,3), "conv1.bias" (32)
    float *grads[LAYER_MAX_PARAMS];      // same shapes, in the gradient block; NULL when frozen.
                                         // A module's lie together, grads[0] first
    int64_t train_off[LAYER_MAX_PARAMS];  // parameter j's offset among the trained scalars
                                          // (state_dict order): where its optimizer state
                                          // lives (net_opt_state); -1 when frozen
    bool frozen;        // its parameters stay fixed: backward computes no gradient for them
    bool frozen_stats;  // batchnorm: normalise by the running statistics, always
    ParamInit init[LAYER_MAX_PARAMS];
    int64_t fan_in;  // for INIT_WEIGHT and INIT_BIAS
    // Saved and loaded, not trained ("bn1.running_mean"): F32 buffers point into the
    // network's buffer block on the device and start at buffer_fill; an I64 buffer
    // ("bn1.num_batches_tracked", a counter) points into the layer's own struct on the host.
    int nbuffers;
    Tensor buffers[LAYER_MAX_BUFFERS];
    float buffer_fill[LAYER_MAX_BUFFERS];
    void *state;  // ops->state_bytes of device memory (the buffer block)
    void *inner;  // what it keeps from forward to backward (inner_bytes; the activation block)
    void *scratch;  // containers: scratch_values a sample, during one forward or backward
    Layer **children;  // containers: inner layers in state_dict order (owned)
    int nchildren;
};

// The layer types, in the order of --help.
extern const LayerOps conv_ops, linear_ops, batchnorm_ops, relu_ops, maxpool_ops, avgpool_ops,
    global_avgpool_ops, dropout_ops, flatten_ops, residual_ops, log_softmax_ops;
extern const LayerOps *const layer_types[];
extern const int layer_ntypes;
const LayerOps *layer_type(const char *section);

// Frees a layer and its children.
void layer_free(Layer *l);
// ops->workspace_bytes(l, k, N), or 0 for a layer without one.
size_t layer_workspace_bytes(const Layer *l, const Kernels *k, int N);
// Whether l has parameters that train (not frozen): a module the optimizer updates.
bool layer_trains(const Layer *l);
// The floats of l's parameters (of its gradients, which lie together from grads[0], when
// it trains).
int64_t layer_param_floats(const Layer *l);
// ops->backward_reads(l), or both for a layer without one.
unsigned layer_backward_reads(const Layer *l);
// BACKWARD_READS_IN, with BACKWARD_READS_OUT when an activation follows (its mask is
// read from the output): conv and linear.
unsigned layer_reads_with_act(Activation act);
// backward_reads for layers whose backward reads nothing of the forward's (dropout
// regenerates its mask; flatten and average pooling only route the gradient), and for
// those that read only the output (relu, log_softmax).
unsigned layer_reads_nothing(const Layer *l);
unsigned layer_reads_out(const Layer *l);

// Helpers for layer implementations.
// Allocates a layer struct of `size` bytes (zeroed), sets ops, in, and the name from the
// section's `name` key (default: the type and its count so far, "conv2" for the second
// [conv] section). Names are PyTorch module paths: parts of letters, digits and '_'
// joined by '.'.
void *layer_alloc(size_t size, const LayerOps *ops, const LayerArgs *a, Error *err);
// The name of the layer that section s makes: its `name` key, or type + count ("conv2").
void layer_section_name(const Cfg *cfg, const CfgSection *s, char *name, size_t size);
// The layer section whose layer is called `name`, or NULL.
CfgSection *layer_find_section(const Cfg *cfg, const char *name);
// Why `name` cannot name a layer ("it is empty", ...), or NULL if it can.
const char *layer_name_problem(const char *name);
// Declares parameter tensor i: "<layer>.<suffix>" with the given PyTorch shape, starting
// as `init` says.
void layer_param(Layer *l, int i, const char *suffix, int ndim, const int64_t *shape,
                 ParamInit init);
// Declares buffer i: "<layer>.<suffix>", F32 of `n` values starting at `fill`, or (n < 0)
// the I64 scalar counter at *counter.
void layer_buffer(Layer *l, int i, const char *suffix, int64_t n, float fill, int64_t *counter);
// The cfg `activation` key shared by conv, linear and batchnorm.
int layer_activation(const LayerArgs *a, Activation *act, Error *err);
// Creates a layer of type ops from cfg text (one section) for input `in`: how containers
// make their children. The text names the child; errors are reported as the parent's
// section's (a->cfg, a->s).
int layer_create_child(Layer **out, const LayerOps *ops, const char *text, Shape in,
                       const LayerArgs *parent, Error *err);

// ---- running layers on stored activations (nn/exec.c) --------------------------------------
// For containers: their children's forward and backward over N samples of stored
// activations (the network's precision), through the fp16 scratch where needed, with the
// batch passes of layers that have them.
void layer_run_forward(const LayerCtx *ctx, Layer *l, void *out, const void *in, int N);
void layer_run_backward(const LayerCtx *ctx, Layer *l, void *din, void *dout, const void *in,
                        const void *out, int N);
// out = act(a + b) over N samples of `values` each (out may be a or b).
void layer_run_add_act(const LayerCtx *ctx, void *out, const void *a, const void *b,
                       int64_t values, int N, Activation act);
// dout *= act'(out), in place (ReLU: where out > 0).
void layer_run_act_backward(const LayerCtx *ctx, void *dout, const void *out, int64_t values,
                            int N, Activation act);
// Bytes of n stored values.
size_t layer_stored_bytes(const LayerCtx *ctx, int64_t n);

#endif
