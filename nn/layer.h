// layer.h: the layer interface. A layer is written once, for every device: it calls the
// device only through the Kernels table in LayerCtx (DESIGN.md decision 1).
//
// Each layer type has its own small struct that starts with a Layer (so a Layer * can be
// cast to it) and an ops table. The network owns all memory: parameters, gradients,
// activations and workspace are pointers into its planned blocks (decision 2).
#ifndef NN_LAYER_H
#define NN_LAYER_H

#include <stdbool.h>
#include <stdint.h>

#include "cfg.h"
#include "kernels.h"
#include "tensor.h"

#define LAYER_MAX_PARAMS 2
#define LAYER_NAME_MAX 64

typedef struct LayerCtx {
    const Kernels *k;
    void *workspace;  // device scratch of at least ops->workspace_bytes(layer, N) bytes
    uint64_t seed;    // run seed: dropout key = rng_key(seed, RNG_STREAM_DROPOUT, step, layer)
    uint64_t step;    // optimizer step (micro-batches of one step share it)
    int64_t sample0;  // index of this micro-batch's first sample within the step's batch
    bool train;       // false: dropout is the identity
} LayerCtx;

typedef struct Layer Layer;

typedef struct LayerOps {
    const char *type;     // the cfg section that makes it: "conv", "linear", ...
    const char *summary;  // one line for --help
    const CfgKey *keys;   // its cfg keys, for validation and --help
    int nkeys;
    // Reads the section's keys, checks them against the input shape and sets up the
    // layer: out shape, parameter tensors (names, PyTorch shapes; data set later).
    int (*create)(Layer **out, const Cfg *cfg, const CfgSection *s, Shape in, Error *err);
    // Bytes of scratch that forward and backward need for a batch of N.
    size_t (*workspace_bytes)(const Layer *l, int N);
    // out (N, out shape) from in (N, in shape).
    void (*forward)(Layer *l, const LayerCtx *ctx, float *out, const float *in, int N);
    // din from dout; parameter gradients accumulate into l->grads. in and out are the
    // forward's input and output. din is NULL when nobody needs it (the first layer).
    // dout may be overwritten.
    void (*backward)(Layer *l, const LayerCtx *ctx, float *din, float *dout, const float *in,
                     const float *out, int N);
} LayerOps;

struct Layer {
    const LayerOps *ops;
    char name[LAYER_NAME_MAX];  // PyTorch module name: "conv1", "fc1"
    int index;                  // position in the network, for RNG keys
    Shape in, out;
    int nparams;                         // parameter tensors (0..LAYER_MAX_PARAMS)
    Tensor params[LAYER_MAX_PARAMS];     // "conv1.weight" (32,1,3,3), "conv1.bias" (32)
    float *grads[LAYER_MAX_PARAMS];      // same shapes, in the gradient block
    int64_t fan_in;  // for PyTorch's default initialisation (net_init_params)
};

// The layer types, in the order of --help.
extern const LayerOps conv_ops, linear_ops, relu_ops, maxpool_ops, dropout_ops, flatten_ops,
    log_softmax_ops;
extern const LayerOps *const layer_types[];
extern const int layer_ntypes;
const LayerOps *layer_type(const char *section);

// Helpers for layer implementations.
// Allocates a layer struct of `size` bytes (zeroed), sets ops, in, and the name from the
// section's `name` key (default: the type and its count so far, "conv2" for the second
// [conv] section).
void *layer_alloc(size_t size, const LayerOps *ops, const Cfg *cfg, const CfgSection *s,
                  Shape in, Error *err);
// The name of the layer that section s makes: its `name` key, or type + count ("conv2").
void layer_section_name(const Cfg *cfg, const CfgSection *s, char *name, size_t size);
// The layer section whose layer is called `name`, or NULL.
CfgSection *layer_find_section(const Cfg *cfg, const char *name);
// Declares parameter tensor i: "<layer>.<suffix>" with the given PyTorch shape.
void layer_param(Layer *l, int i, const char *suffix, int ndim, const int64_t *shape);
// The cfg `activation` key shared by conv and linear.
int layer_activation(const Cfg *cfg, const CfgSection *s, Activation *act, Error *err);

#endif
