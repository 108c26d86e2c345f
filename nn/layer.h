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
//   containers  (the residual block, decision 11) own inner layers (children) for their
//               names, parameters and cfg, and say how they compute by expanding into
//               nodes: their children and the sums between them. The network runs, plans
//               and checkpoints the nodes (nn/net.h): a segment may begin inside a block,
//               and each node's output lives only as long as the step needs it.
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

// The general block's sections (nn/block.c): [block] opens its member list, [shortcut]
// starts the shortcut's members, [end] closes it.
#define BLOCK_TYPE "block"
#define BLOCK_SHORTCUT "shortcut"
#define BLOCK_END "end"
#define BLOCK_MAX_DEPTH 8

enum { BACKWARD_READS_IN = 1, BACKWARD_READS_OUT = 2 };

typedef struct Exec Exec;  // nn/exec.h

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
    bool grads_zero;   // backward: the layer's gradients hold zeros until it adds to them
                       // (the fused update's, zeroed for this backward), so a layout change
                       // of them (conv's permute) may be skipped
} LayerCtx;

typedef struct Layer Layer;

// The network computes with nodes (nn/net.h): a leaf layer, a sum of two nodes' outputs, or
// a sweep: a chain of leaves run over chunks of samples (nn/exec.h).
enum { NODE_INPUT = -1 };  // the network's input, where a node's input may be
typedef enum NodeKind { NODE_LEAF, NODE_SUM, NODE_SWEEP } NodeKind;
#define NODE_CHAIN_MAX 4
typedef struct NetNode {
    NodeKind kind;
    Layer *l;                      // NODE_LEAF: the layer it runs
    Activation act;                // NODE_SUM: out = act(in[0] + in[1])
    Layer *chain[NODE_CHAIN_MAX];  // NODE_SWEEP: leaves, each reading the one before
    int nchain;
    int chunk;                     // NODE_SWEEP: samples a chunk
    int in[2];        // the nodes it reads (NODE_INPUT: the network's input); in[1]: sums only
    Shape out;
    bool jit;         // cheap to recompute: its output is not kept for backward but computed
                      // again from its input where a backward reads it (a batchnorm between
                      // two convolutions, a 1x1 downsampling convolution; with
                      // NetOptions.recompute_1x1 a block's widening 1x1 convolutions)
    int top;          // the top-level layer it is part of
    bool virt;        // F16, set by the schedule: a jit leaf whose output is never stored;
                      // its one reader, a leaf, computes it a chunk at a time from its
                      // input (Stored.via), and its forward is its batch pass alone
    bool compress;    // what backward reads of its output may be kept compressed
                      // (NetOptions.compress, not in compress_skip)
    bool packed;      // set by the schedule: it is (net.c), and backward reads it so
} NetNode;
typedef struct NodeList {
    NetNode *node;
    int n, cap;
    Shape input;  // of NODE_INPUT
    int top;      // the top-level layer being expanded
    bool recompute_1x1;  // NetOptions.recompute_1x1: a block's widening 1x1 convolutions are jit
    int widening_1x1;    // those a block found (jit or not)
} NodeList;
// Appends a leaf node running l on node in's output; its index, or -1 with err.
int node_leaf(NodeList *nl, Layer *l, int in, bool jit, Error *err);
// Appends the sum act(out(a) + out(b)) (equal shapes); its index, or -1 with err.
int node_sum(NodeList *nl, int a, int b, Activation act, Error *err);

// What a layer is made from: its cfg section and the shape of its input, and the backend it
// will run on.
typedef struct LayerArgs {
    const Cfg *cfg;
    const CfgSection *s;
    Shape in;
    int classes;  // the data's class count (a [linear] with `outputs = classes` takes it)
    // With the network's GEMM arithmetic set (net_create), for choices that depend on what
    // its kernels do fastest (conv's auto algorithm); NULL: the choices of no backend.
    const Kernels *k;
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
    // Whether backward scales dout in place (an activation's derivative: conv and linear
    // with a ReLU); NULL: it leaves dout as it is.
    bool (*backward_writes_dout)(const Layer *l);
    // Samples q such that forward and backward over consecutive sub-batches of a pass,
    // each a multiple of q samples but the last, give the bits of one call over the whole
    // pass (a convolution whose GEMMs go image chunk by image chunk, its weight gradient
    // accumulated chunk after chunk); 0 or NULL: no such q. Such a layer may be a sweep's
    // first member (nn/exec.h; the cheap members, batchnorm, ReLU, pooling, dropout,
    // compute each sample alone), and as the first layer of a network with a byte input
    // (NetOptions.input_bytes) in F32 it reads its input expanded q samples at a time.
    int (*sample_quantum)(const Layer *l, const Kernels *k);
    // Whether din may be the same buffer as in: backward reads each sample's input before
    // it writes that sample's input gradient (the network then writes a gradient over an
    // output nothing reads any more). NULL: no.
    bool (*din_over_in)(const Layer *l);
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

    // Bytes per sample kept from forward to backward besides the output (max pooling's
    // argmax): l->inner holds batch times that many, sample after sample. NULL: none.
    size_t (*inner_bytes)(const Layer *l, DType precision);

    // ---- containers ---------------------------------------------------------------------
    // Appends the nodes that compute l to nl, fed by node `in` (NODE_INPUT: the network's
    // input): its children as leaves, and the sums that join them. Returns the node of l's
    // output, or -1 with err.
    int (*expand)(Layer *l, NodeList *nl, int in, Error *err);
} LayerOps;

struct Layer {
    const LayerOps *ops;
    char name[LAYER_NAME_MAX];  // PyTorch module path: "conv1", "layer1.0.bn2"
    int index;                  // position among all layers, inner ones included (RNG keys)
    Shape in, out;
    int nparams;                         // parameter tensors (0..LAYER_MAX_PARAMS)
    Tensor params[LAYER_MAX_PARAMS];     // "conv1.weight" (32,1,3,3), "conv1.bias" (32)
    float *grads[LAYER_MAX_PARAMS];      // same shapes, in the gradient block (the fused update:
                                         // in its node's buffer of the activation block); NULL
                                         // when frozen. A module's lie together, grads[0] first
    int64_t train_off[LAYER_MAX_PARAMS];  // parameter j's offset among the trained scalars
                                          // (state_dict order): where its optimizer state
                                          // lives (net_opt_state); -1 when frozen
    int64_t state_block[LAYER_MAX_PARAMS];  // int8 optimizer state: the first of parameter
                                            // j's blocks among all (nn/quant.h)
    bool frozen;        // its parameters stay fixed: backward computes no gradient for them
    bool frozen_stats;  // batchnorm: normalise by the running statistics, always
    // Backward reads the input back from compressed codes (set by the network: the input's
    // node is NetNode.packed), which are not the forward's values: a layer whose backward
    // would recompute something nonlinear from them reads it from its output instead
    // (batchnorm's activation mask: from the codes, it would pass gradients the forward's
    // ReLU stopped, and stop others; a bias, not noise).
    bool in_compressed;
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
    Layer **children;  // containers: inner layers in state_dict order (owned)
    int nchildren;
};

// The layer types, in the order of --help.
extern const LayerOps conv_ops, linear_ops, batchnorm_ops, relu_ops, relu6_ops, maxpool_ops,
    avgpool_ops, global_avgpool_ops, dropout_ops, flatten_ops, block_ops, residual_ops, log_softmax_ops;
extern const LayerOps *const layer_types[];
extern const int layer_ntypes;
const LayerOps *layer_type(const char *section);

// A [conv] section with groups > 1 (nn/conv_grouped.c): conv_ops's create hands it over.
int conv_grouped_create(Layer **out, const LayerArgs *a, Error *err);
// The keys a [conv] section's two forms share (nn/conv.c), read from a's section and
// checked against its input (`name` for messages); out: the output's shape.
typedef struct ConvWindow {
    int filters, size, stride, pad;
    bool bias;
    Activation act;
    Shape out;
} ConvWindow;
int conv_window(const LayerArgs *a, const char *name, ConvWindow *w, Error *err);

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
// Whether l is a convolution ([conv], any groups).
bool layer_is_conv(const Layer *l);
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
// The name of the layer that section s makes: its `name` key, or type + count ("conv2");
// a block's member is named under its block (nn/block.c): "layer1.0" + "." + its `name`
// key, or its place (body: "0", "1", ...; shortcut: "downsample.0", ...).
void layer_section_name(const Cfg *cfg, const CfgSection *s, char *name, size_t size);
// Whether section s makes a layer: not [train], [data] nor a block's markers.
bool layer_is_section(const CfgSection *s);
// The [block] section whose members s is one of, or NULL for a top-level layer.
const CfgSection *layer_section_block(const Cfg *cfg, const CfgSection *s);
// Sections that the layer of section s spans: 1, or a [block] through its [end]; -1 with
// err for a [block] without its [end] or a marker outside a block.
int layer_section_extent(const Cfg *cfg, const CfgSection *s, Error *err);
// The top-level layers of cfg (a [block] through its [end] is one), each section checked by
// layer_section_extent; -1 with err for the first it refuses. The names above follow the
// blocks only where this holds.
int layer_section_count(const Cfg *cfg, Error *err);
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

#endif
