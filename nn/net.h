// net.h: a sequential network built from the cfg, with its memory planned and allocated
// once (DESIGN.md decision 2).
//
// net_create infers every shape, computes the plan, and allocates one block per category
// on the device: parameters, gradients, optimizer state, buffers (batchnorm statistics),
// activations (+ labels and metrics), workspace. Nothing is allocated after that; forward
// and backward only use these blocks.
//
// The network is a sequence of top-level layers; a container (a residual block) is one of
// them and owns inner layers (DESIGN.md decision 11, as revised: see README's design
// section). `modules` lists every layer, inner ones included, in state_dict order:
// parameters, buffers and checkpoints follow it. A step computes with nodes: every leaf
// layer, and the sums containers expand into (layer.h NetNode), in a topological order;
// the schedule, the activation plan and checkpoint segments are over nodes, so a segment
// may begin inside a block and a cheap node (jit) may be recomputed instead of kept.
#ifndef NN_NET_H
#define NN_NET_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "cfg.h"
#include "exec.h"
#include "kernels.h"
#include "layer.h"

// Bytes per category. `loader` and `exchange` are filled in by the trainer (the data side
// plans the loader; with several processes the gradient sums' received slices are the
// exchange's); `threads` is what the backend keeps per compute thread outside the blocks
// (Kernels.thread_scratch: the CPU's GEMM packing buffers).
typedef struct MemPlan {
    size_t params, grads, optimizer, buffers, activations, workspace, threads, loader, exchange;
    // The gradient block without the fused update: every trained parameter's gradient.
    // Equal to `grads` unless NetOptions.fused_update, where `grads` is 0: each node's
    // trained modules' gradients are a buffer of the activation block, live at the node's
    // backward alone.
    size_t grads_unfused;
    // Of `activations`: the bytes live at the loss, what forward keeps for backward: the
    // input and labels, every output that a backward reads (with checkpointing, each
    // segment's last and the last segment's), the inner activations, the output, dlogp.
    size_t act_kept;
    // Of act_kept: the compressed activations' records (NetOptions.compress).
    size_t act_packed;
    // The layers' workspace where `activations` holds it (each node's a buffer live at its
    // events, placed in the block's holes): the largest node's; 0 where `workspace` holds
    // the largest apart.
    size_t act_workspace;
} MemPlan;

size_t mem_plan_total(const MemPlan *p);
// The blocks the network allocates through its kernel table (all but threads and loader,
// which stay in host memory): what a GPU holds of the plan.
size_t mem_plan_blocks(const MemPlan *p);
// What the plan takes of the memory of device k: the total where the device's memory is
// the host's (the CPU), the blocks elsewhere.
size_t mem_plan_on(const MemPlan *p, const Kernels *k);

// The arithmetic of the GEMMs (the cfg's `matmul`), which Net.gemm_arith holds: AUTO
// follows the precision (TF32 for fp16, whose operands lose nothing by it; bf16 for bf16;
// fp32 for fp32); the others name it whatever the activations are stored as (bf16 GEMMs on
// fp32 activations: the speed of bf16 arithmetic without the conversions of bf16 storage).
typedef enum Matmul { MATMUL_AUTO, MATMUL_FP32, MATMUL_TF32, MATMUL_BF16, MATMUL_COUNT } Matmul;
extern const char *const matmul_names[MATMUL_COUNT];  // "auto", "fp32", "tf32", "bf16"

// How the network is built and stored.
typedef struct NetOptions {
    int batch;        // the largest N that forward/backward accept (the micro-batch)
    DType precision;  // DT_F32, or DT_F16 / DT_BF16: activations and their gradients stored
                      // as IEEE halves / bfloat16, computed in fp32 (DESIGN.md decision 4);
                      // the GEMMs' arithmetic follows it unless `matmul` names one
    int segments;     // activation checkpointing (decision 6): 0 or 1 = none; S > 1 splits
                      // the nodes into S segments; NET_SEGMENTS_SQRT = round(sqrt(nodes))
    bool plan_only;   // compute net->plan and allocate nothing (./train --plan)
    bool sweep;          // chains of cheap per-sample layers (and the stem convolution) run
                         // as sweeps over chunks of samples (nn/exec.h): checkpointing's
                         // recomputation below the layer (the trainer sets it with segments)
    size_t sweep_bytes;  // the scratch a sweep's chunk may take, which sets its samples (0: 8 MB)
    Matmul matmul;    // the GEMMs' arithmetic (Kernels.gemm_arith); MATMUL_AUTO: by precision
    // Optimizer state tensors kept per trained parameter (optim_nstates) and their names,
    // and how they are stored (nn/quant.h: fp32, or compressed to bf16 or int8 blocks).
    int opt_states;
    const char *const *opt_state_names;
    StateFormat opt_format;
    // Layers whose parameters stay fixed: names, or module paths above them ("layer1").
    // They get no gradient and no optimizer memory; with freeze_stats their batchnorms
    // normalise by the running statistics, which do not move (evaluation mode).
    const char *const *freeze;
    int nfreeze;
    bool freeze_stats;
    // The input holds bytes (N, H, W, C) as the loader hands them out, read by the first
    // layer as lut[c][byte] (net_put_input): a quarter of an fp32 input's memory, the
    // same floats; on a device whose memory is the host's (the CPU) the network reads them
    // where the caller keeps them and holds none. false: fp32 values in input_buf (tests,
    // tools that make their own).
    bool input_bytes;
    // The fused optimizer update (fp32 only; the trainer allows it with accumulate = 1):
    // each trained module is updated during backward, through Net.hook, as soon as its
    // gradients are complete and nothing later in the step reads its parameters; a node's
    // modules' gradients (a leaf's, or a sweep's members' together) are a buffer of the
    // activation block live at its backward alone, zeroed before it: no gradient block.
    bool fused_update;
    // A block's 1x1 convolutions that do not narrow (a Bottleneck's conv3, an
    // InvertedResidual's expansion), whose output only the batchnorm after them reads, are
    // jit: recomputed from their input (which backward keeps anyway) where batchnorm's
    // backward reads them, instead of kept: the same bits, for a GEMM more (nn/block.c).
    bool recompute_1x1;
    // Compressed activations (nn/quant.h): 0, or 2, 4 or 8: what a backward reads of a
    // node's output (a convolution's input, a ReLU's output) is kept as codes of that
    // many bits, stochastically rounded, while forward reads the exact values: the output
    // lives whole only until its readers' forward (or recomputation) and the codes until
    // the backward. A jit node is then kept compressed instead of being recomputed, a
    // sweep's input stays exact (its backward runs its members' forward again from it), and
    // a batchnorm + ReLU whose input is compressed reads its mask from its output
    // (Layer.in_compressed), which is kept for it where no other backward reads it.
    // It changes the result. compress_skip: layers (names, or module paths above them)
    // whose outputs stay exact.
    int compress;
    const char *const *compress_skip;
    int ncompress_skip;
    // Tests: every activation buffer keeps bytes of its own (no handoffs, net_handoff, and
    // no backward adding a term into a gradient, NodeBufs.adds): the plan whose bits the
    // shared one's are checked against.
    bool apart;
    // Tests: the layers' workspace in the workspace block, never in the activation block's
    // holes (MemPlan.act_workspace 0).
    bool workspace_apart;
} NetOptions;

#define NET_SEGMENTS_SQRT (-1)

enum { NET_LOSS, NET_CORRECT, NET_METRICS };
#define NET_METRICS_SUMSQ_OFFSET 8  // bytes into the metrics' 64: Net.grad_sumsq

// The step's schedule: every node's forward (events 0 .. nnodes - 1), the loss (event
// nnodes), then backward: per segment from the last, the recomputation of its nodes
// (checkpointing) and the backward of each, with a jit node recomputed before the first
// backward that reads its output, and EV_GRAD_ADD where a node's output gradient gets a
// second term (a block's input: the shortcut's and conv1's).
typedef enum EventKind { EV_FORWARD, EV_LOSS, EV_RECOMPUTE, EV_BACKWARD, EV_GRAD_ADD } EventKind;
typedef struct Event {
    EventKind kind;
    int node;
} Event;

// A buffer of the activation block (the input, a layer's output or inner activations, an
// input gradient, ...) holds something over spans of events [from, to] (nevents: after
// the step); buffers live at the same event never overlap, others may (nn/net.c), but
// at a handoff (net_handoff): there a leaf writes one over the other chunk by chunk, and
// the two share their bytes for the whole step (the same offset; `over`).
typedef struct ActSpan {
    int from, to;
} ActSpan;
typedef struct ActBuffer {
    size_t offset, bytes;  // in the activation block; bytes 0: not used
    int span0, nspans;     // its spans: spans[span0 .. span0 + nspans), in time order
    int first, last;       // the first event of its first span and the last of its last
    int over;              // -1, or the buffer whose bytes it shares (which shares none)
} ActBuffer;

// The activation buffers of a node (ids of Net.bufs; -1: none): its output (a sum's may
// be its first input's), its output gradient (nodes may share one), the second term of
// that gradient, and where its backward writes its input gradient (a leaf's). With
// `adds` a leaf's backward adds its input gradient chunk by chunk into din, which holds
// the input's gradient already (a later term, without a term buffer or EV_GRAD_ADD).
typedef struct NodeBufs {
    int out, grad, term, din;
    bool adds;
} NodeBufs;

// What backward calls once a trained module (a layer with parameters, not frozen) is done
// with in the step: its gradients in m->grads are complete (accumulate = 1, fp32) and
// nothing later in the step reads its parameters, so they may be updated and the gradients'
// memory reused (the fused optimizer update, NetOptions.fused_update). net_backward calls
// it after each node's backward for the node's trained modules (a sweep's members
// together, after the sweep): a layer reads its parameters only in its forward and
// backward, and the schedule recomputes a node only before its own backward (net.c).
typedef struct GradHook {
    // Returns 0, or -1 to stop the step (arg carries the error): `failed` is set then and
    // ready is not called again.
    int (*ready)(void *arg, Layer *m);
    void *arg;
    bool failed;
} GradHook;

typedef struct Net {
    const Kernels *k;
    Layer **layers;  // the top-level layers: host structs whose tensors point into the blocks
    int nlayers;
    Layer **modules;  // every layer, containers' children after their container (pre-order)
    int nmodules;
    NetNode *nodes;   // what a step computes, in order: leaves and sums (layer.h)
    int nnodes;
    Shape input;
    int batch;        // the largest N that forward/backward accept
    DType precision;  // of activations and activation gradients (the output is always F32)
    GemmArith gemm_arith;  // Kernels.gemm_arith during forward and backward (NetOptions.matmul)
    int nsegments;    // checkpoint segments (1: none)
    int *seg_first;   // (nsegments + 1): segment s is nodes seg_first[s] .. seg_first[s+1]-1
    Exec exec;        // precision, the fp16 chunk and scratch
    size_t scratch_bytes;  // the executor's scratch (Exec.scratch) at the start of the workspace block
    int64_t nparams;  // scalars in all parameter tensors
    int64_t ntrain;   // of them, in trained (not frozen) tensors
    int nstates;      // optimizer state tensors per trained parameter
    StateFormat opt_format;  // how they are stored (NetOptions.opt_format)
    int64_t nblocks;  // int8: the blocks of one state over all trained tensors
    const char *const *state_names;  // their names ("square_avg", ...)
    int first_trained;  // the first node with a trained parameter: backward stops there
                        // (nnodes when everything is frozen)
    int ntrained_modules;  // modules that train (layer_trains): the hook's calls in a step
    bool fused_update;     // NetOptions.fused_update: no gradient block, each node's
                           // modules' gradients a buffer of the activation block
    bool recompute_1x1;    // NetOptions.recompute_1x1
    bool apart;            // NetOptions.apart
    bool workspace_apart;  // NetOptions.workspace_apart; and while the segments' search plans
    int widening_1x1;      // the 1x1 convolutions it makes jit (whether or not it is set)
    // Called by net_backward after each node's backward for each of its trained modules
    // (GradHook); ready NULL: none. The trainer sets it for the fused update; the network
    // never calls the optimizer itself.
    GradHook hook;
    MemPlan plan;
    Event *events;  // the schedule of a step
    int nevents;
    ActBuffer *bufs;  // the activation block's buffers and their spans
    int nbufs;
    NodeBufs *nbuf;   // (nnodes) each node's buffers
    ActSpan *spans;
    int nspans;
    size_t block_cost;  // the activation block and the layers' workspace apart, if it is
                        // (place_buffers): what the segments' search compares plans by
    // Device blocks (one allocation each) and pointers into them.
    float *params;     // (nparams): every layer's tensors, in layer order
    float *grads;      // the gradient block: (ntrain), the trained tensors' gradients in the
                       // same order; fused_update: NULL, each node's trained modules'
                       // gradients in a buffer of the activation block (Layer.grads)
    void *optimizer;   // (nstates * ntrain) values of opt_format: state s of the trained
                       // parameter at train_off t is value s * ntrain + t; int8: then
                       // (nstates * nblocks) floats, the blocks' absmax (net_opt_state)
    void *buffers;     // every layer's F32 buffers, then every layer's state
    void *activations;
    void *workspace;        // the executor's scratch, then layer_workspace
    void *layer_workspace;  // what layers get as LayerCtx.workspace where the plan keeps the
                            // layers' workspace apart (MemPlan.act_workspace 0); else each
                            // node's layers get their node's buffer of the activation block
    bool input_bytes;  // NetOptions.input_bytes
    float *input_buf;  // (batch, H, W, C) F32: the batch to forward; NULL with input_bytes
    const uint8_t *input_u8;  // input_bytes: (batch, H, W, C) the batch to forward, as
                              // bytes: in the activation block, or (host memory) the
                              // caller's (net_put_input)
    float *input_lut;  // input_bytes: (C, 256) the value of each byte of each channel
    float *lut_host;   // input_bytes: (C, 256) what input_lut holds (NaN before the first)
    void **acts;       // acts[j]: (batch, nodes[j].out) output of node j, in precision; the
                       // last node's (the log-probabilities) is F32. Valid while the
                       // schedule has it live: the output after the step, an output that
                       // no backward reads only until its consumers' forward
    void **grad;       // grad[j]: (batch, nodes[j].out) the gradient of node j's output, in
                       // precision (NULL: not needed); nodes may share one (an in-place
                       // backward, a sum passing its gradient on)
    void **term;       // term[j]: where a second term of grad[j] is written before
                       // EV_GRAD_ADD adds it (NULL: none)
    void **scratch;    // scratch[j]: a sweep's (exec_sweep_bytes), during its own events
    void **packs;      // packs[j]: (batch) records of node j's output compressed (NetNode.packed),
                       // written by its forward (and recomputation), read by backward
    float *dlogp;        // (batch, classes) F32: the loss gradient
    int32_t *labels;     // (batch)
    float *metrics;      // [NET_METRICS]: summed loss and correct count (nll_loss adds to them)
    double *grad_sumsq;  // the step's squared gradient norm (gradient clipping), beside them
    ScalerState *scaler; // the loss scaler's state (nn/scaler.h): its scale multiplies the loss
                         // gradient; {scale 1} from net_create, the trainer's with fp16
    float label_smoothing;  // of the training loss (Kernels.nll_loss; net_loss with grad): 0
                            // from net_create, the trainer's; evaluation is plain NLL
    // Called as each event of a step begins, with the top-level layer of its node and
    // whether it belongs to backward (nn/profile.h); NULL: nothing.
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

// int8: where the absmax floats start in the optimizer block (after the codes, aligned).
static inline size_t net_opt_absmax_offset(const Net *net) {
    return ((size_t)net->nstates * (size_t)net->ntrain + 255) / 256 * 256;
}

// Optimizer state s of trained parameter j of module l (its place among the trained scalars,
// wherever its gradient is): its values in net->opt_format (fp32: floats) and, int8, its
// blocks' absmax (else NULL).
static inline PackedState net_opt_state(const Net *net, const Layer *l, int j, int s) {
    const size_t v = (size_t)s * (size_t)net->ntrain + (size_t)l->train_off[j];
    PackedState p = {(char *)net->optimizer + v * state_format_bytes(net->opt_format), NULL};
    if (net->opt_format == STATE_INT8)
        p.absmax = (float *)((char *)net->optimizer + net_opt_absmax_offset(net)) +
                   (size_t)s * (size_t)net->nblocks + (size_t)l->state_block[j];
    return p;
}

// With input_bytes: n samples of bytes px (n, H, W, C) become the network's input, and the
// table lut (C, 256: lut[c * 256 + b] is the value of byte b in channel c) is copied when
// it differs from the one there. n <= batch. On a device whose memory is the host's the
// network reads px where it is (no copy of a batch exists): px must stay as it is until
// the next net_put_input, through the step's backward (a loader's batch does: it is valid
// until the loader's next one). Elsewhere px is uploaded and may go at once.
void net_put_input(Net *net, const uint8_t *px, const float *lut, int n);

// Forward of N samples from the network's input (input_buf or input_u8); the output
// (log-probabilities) is net->acts[nnodes - 1]. step and sample0 key the dropout masks
// (see LayerCtx).
void net_forward(Net *net, int N, bool train, uint64_t seed, uint64_t step, int64_t sample0);
static inline float *net_output(const Net *net) { return (float *)net->acts[net->nnodes - 1]; }

// NLL loss of the output against net->labels, mean over `denominator` samples:
// adds to net->metrics and, if grad, writes the output gradient, times the loss scale of
// net->scaler, into dlogp; with grad, smoothed by net->label_smoothing (a training step's
// loss; without, plain NLL: evaluation).
void net_loss(Net *net, int N, int denominator, bool grad);

// Backward of N samples from the output gradient in dlogp (net_loss); parameter
// gradients accumulate into net->grads. Same step/sample0 as the forward. With net->hook
// set, it is called after each trained module's backward (GradHook), and the step stops
// calling it after a failure (hook.failed).
void net_backward(Net *net, int N, uint64_t seed, uint64_t step, int64_t sample0);

// Zeroes the gradient block (none with the fused update: net_backward zeroes a node's
// gradients before its backward).
void net_zero_grads(Net *net);

// Whether activation buffer b is live at event t (nevents: after the step).
bool net_buffer_live(const Net *net, int b, int t);
// Whether event t hands buffer x's bytes over to buffer y: a leaf's forward reads x as its
// input and writes y as its output, or its backward reads x as its output gradient and
// writes y as its input gradient, a chunk of samples at a time (nn/exec.c: y's chunk goes
// where x's was read), y no larger a sample than x, x's span ending at t and y's starting.
bool net_handoff(const Net *net, int x, int y, int t);

// Prints the layer table (name, type, output shape, parameters) and the total.
void net_print(const Net *net, FILE *f);

// Whether a training step's result depends on how its batch is split into micro-batches
// beyond float rounding: some layer normalises by the statistics of the (micro-)batch it
// sees (batchnorm in training mode, not frozen).
bool net_batch_coupled(const Net *net);

#endif
