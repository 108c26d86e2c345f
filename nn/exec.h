// exec.h: running layers over stored activations (DESIGN.md decisions 1, 4 and 11).
//
// Activations are stored in the network's precision: F32, or halves (16 bits, half the
// memory): F16 (IEEE binary16) or BF16 (bfloat16). Leaf layers compute in fp32; with
// halves the executor runs a leaf over chunks of
// samples, converting each chunk's input (and, in backward, output and output gradient)
// into fp32 scratch and the result back to halves, so layers stay fp32 code. Layers
// with batch passes (batchnorm) get their pass over every chunk first. The network runs
// its nodes (leaves and sums, nn/net.h) through these functions. The network's input may
// be bytes (the loader's, NetOptions.input_bytes): the first layer then reads them
// normalised, expanded into fp32 a chunk at a time where its results do not depend on the
// chunks (LayerOps.sample_quantum), or whole into a transient buffer. What a backward
// reads of an output may be kept compressed (NetOptions.compress, nn/quant.h): the
// executor then reads it back a chunk at a time through the scratch, in F32 too.
#ifndef NN_EXEC_H
#define NN_EXEC_H

#include "layer.h"

struct CostTable;  // nn/cost.h

struct Exec {
    DType precision;      // of stored activations: DT_F32, DT_F16 or DT_BF16
    int pack_bits;        // compressed activations' width (STORED_PACKED), 0: none
    int64_t slot_values;  // fp32 values in each scratch slot (where there are slots)
    float *scratch[4];    // slot_values F32 each: halves use 4; F32 slots 0 to 2 where a
                          // backward reads compressed activations (then also hands over and
                          // adds), slots 0 and 1 where only forwards hand over
    struct CostTable *costs;  // a probe's: every call is timed into it (NULL: none)
    // A byte input (STORED_U8: the network's input with NetOptions.input_bytes) is read as
    // lut[c][byte] (C, 256, on the device), expanded into fp32 chunk by chunk: with halves
    // through scratch slot 0 (the chunks of exec_chunk), in F32 into input_f32, which holds
    // input_chunk samples (the whole batch, or a multiple of the first layer's
    // sample_quantum: chunks that give the bits of one call).
    const float *lut;
    int input_c;          // C
    float *input_f32;     // F32: (input_chunk, input shape)
    int input_chunk;
};

// Samples per call of leaf l in a pass over N: with halves as many as a scratch slot holds of
// the larger of its input and output (at least 1, at most N), so a layer with small
// activations runs on large chunks (a GEMM over one sample of a 7x7 layer would pack the
// whole weight for 49 rows); N in F32.
int exec_chunk(const Exec *e, const Layer *l, int N);

// How a stored activation holds its values: fp32; halves (the executor's F16 or BF16
// precision); bytes read through Exec.lut (the network's input with input_bytes); the
// records of compressed activations, Exec.pack_bits wide (what a backward reads).
typedef enum StoredKind { STORED_F32, STORED_HALF, STORED_U8, STORED_PACKED } StoredKind;

// Whether a precision stores activations in 16 bits (F16 or BF16: the executor's halves).
static inline bool precision_is_half(DType p) { return p == DT_F16 || p == DT_BF16; }

// The cfg's word for a precision: "fp32", "fp16", "bf16".
static inline const char *precision_name(DType p) { return p == DT_F16 ? "fp16" : p == DT_BF16 ? "bf16" : "fp32"; }

// A stored activation: in the executor's precision, in F32 (the network's input and its
// output, the log-probabilities), or the network's byte input. With `via` (halves only) it is
// not the values but via's input: a reader gets via's output computed a chunk at a time
// (via's forward on the chunk, rounded to halves as a stored output would be), so via's
// output never exists whole (a node the network does not store: NetNode.virt).
typedef struct Stored {
    void *p;
    StoredKind kind;
    Layer *via;
} Stored;

// F32 where f32 is set, else the executor's halves.
static inline Stored stored_in(void *p, bool f32) { return (Stored){.p = p, .kind = f32 ? STORED_F32 : STORED_HALF}; }

// How a backward's input gradient reaches din: written there (over dout where the layer
// computes in place, or with halves through the scratch); written a chunk at a time
// through the scratch where that chunk of dout was read (din and dout share bytes: a
// handoff, nn/net.h's net_handoff); or added to what din holds (a later term of a
// gradient, NodeBufs.adds), a chunk at a time, rounded to the stored precision first as a
// term kept apart would be, so the sum has the bits of a term's EV_GRAD_ADD.
typedef enum DinMode { DIN_WRITE, DIN_OVER_DOUT, DIN_ADD } DinMode;

// Layer l forward over N samples (out from in), and backward (din from dout; din.p NULL
// when nobody needs it); parameter gradients accumulate. A STORED_U8 input is read
// normalised (Exec.lut), in chunks where Exec says so. Where out.p is in.p (a handoff)
// forward runs over chunks, each chunk's output written through the scratch where its
// input was read, after the batch pass (batchnorm's statistics) has read all of it.
void exec_forward(const LayerCtx *ctx, Layer *l, Stored out, Stored in, int N);
// Layer l's batch pass alone (batchnorm's statistics), where its forward needs one: the
// forward of a node whose output its reader computes (Stored.via).
void exec_forward_stats(const LayerCtx *ctx, Layer *l, Stored in, int N);
void exec_backward(const LayerCtx *ctx, Layer *l, Stored din, Stored dout, Stored in, Stored out,
                   int N, DinMode mode);

// out = act(a + b) over N samples of `values` each (out may be a or b).
void exec_add_act(const LayerCtx *ctx, Stored out, Stored a, Stored b, int64_t values, int N,
                  Activation act);
// dout *= act'(out), in place (act_passes: ReLU where out > 0, ReLU6 where 0 < out < 6).
void exec_act_backward(const LayerCtx *ctx, Stored dout, Stored out, int64_t values, int N,
                       Activation act);

// The N samples of `src` (`values` each) compressed into the records at dst
// (Kernels.act_pack, Exec.pack_bits wide) with the random bits of `key`.
void exec_pack(const LayerCtx *ctx, void *dst, Stored src, int64_t values, int N, uint64_t key);

// A sweep (a NODE_SWEEP of nn/net.h): leaves m[0 .. nm), each reading the one before,
// run over chunks of `chunk` samples, each chunk through all of them before the next, so
// what passes between them exists one chunk at a time, in `scratch` (exec_sweep_bytes).
// A member's batch pass (batchnorm's) runs over every chunk first, with the members before
// it for its input; backward runs the members' forward again on each chunk where their
// backward reads it (their inner activations, max pooling's argmax, included), with the
// forward's batch statistics. The results are the unswept members' bits where their
// batch sums and chunked calls give one call's (LayerOps.sample_quantum); in F16 what
// passes between members is rounded to halves as the network would store it.
typedef struct Sweep {
    Layer *const *m;
    int nm, chunk;
    bool bytes_in;  // the chain's input is the network's bytes (STORED_U8)
    void *scratch;
} Sweep;
size_t exec_sweep_bytes(const Exec *e, const Sweep *s);
void exec_sweep_forward(const LayerCtx *ctx, const Sweep *s, Stored out, Stored in, int N);
// din.p NULL: the chain's input gradient is not needed (the network's input).
void exec_sweep_backward(const LayerCtx *ctx, const Sweep *s, Stored din, Stored dout, Stored in,
                         int N);

#endif
