#include "tensor.h"

const char *const dtype_names[DT_COUNT] = {"F32", "F16", "I64", "I32", "U8", "BF16"};
const size_t dtype_sizes[DT_COUNT] = {4, 2, 8, 4, 1, 2};
static_assert(DT_COUNT == 6, "dtype tables must list every DType");

int64_t tensor_numel(const Tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

size_t tensor_bytes(const Tensor *t) { return (size_t)tensor_numel(t) * dtype_sizes[t->dtype]; }
