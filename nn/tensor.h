// tensor.h: named tensors (parameters, checkpoint entries) and activation shapes.
#ifndef NN_TENSOR_H
#define NN_TENSOR_H

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum DType { DT_F32, DT_F16, DT_I64, DT_I32, DT_U8, DT_BF16, DT_COUNT } DType;
extern const char *const dtype_names[DT_COUNT];  // safetensors spellings: "F32", ...
extern const size_t dtype_sizes[DT_COUNT];

#define TENSOR_MAX_DIMS 4
#define TENSOR_NAME_MAX 128

// A named view of memory. Does not own data. Shapes are PyTorch's (row-major).
typedef struct Tensor {
    char name[TENSOR_NAME_MAX];
    DType dtype;
    int ndim;
    int64_t shape[TENSOR_MAX_DIMS];
    void *data;
} Tensor;

int64_t tensor_numel(const Tensor *t);
size_t tensor_bytes(const Tensor *t);

// The shape of one sample's activation. Activations are stored channel-last, a batch
// is (N, H, W, C) row-major: convolutions then run as one GEMM over the whole batch.
// Flatten turns (H, W, C) into PyTorch's (C*H*W) order, so linear weights keep
// PyTorch's layout. Fully connected activations have h = w = 1.
typedef struct Shape {
    int c, h, w;
} Shape;

static inline int64_t shape_numel(Shape s) { return (int64_t)s.c * s.h * s.w; }

// The network's input as the data code makes it: 1 (gray) or 3 (RGB) channels and sides
// of 1 to INPUT_MAX_SIDE pixels. [data]'s width and height, IDX files and a checkpoint's
// metadata are held to it, so no image is ever decoded into another shape.
#define INPUT_MAX_SIDE 16384
static inline bool shape_is_input(Shape s) {
    return (s.c == 1 || s.c == 3) && s.h >= 1 && s.h <= INPUT_MAX_SIDE && s.w >= 1 &&
           s.w <= INPUT_MAX_SIDE;
}

#endif
