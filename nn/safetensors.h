// safetensors.h: reading and writing safetensors files (DESIGN.md decision 7).
//
// The format (https://github.com/huggingface/safetensors):
//
//     u64 N, little-endian | N bytes of JSON header | data section
//
// The header is one JSON object: each tensor name maps to
// {"dtype":"F32","shape":[32,1,3,3],"data_offsets":[begin,end]} (byte offsets into the
// data section, end exclusive), and an optional "__metadata__" maps strings to strings.
// Data is little-endian and row-major.
//
// Reading is strict, as strict as the reference implementation or more: st_open checks
// everything before it hands out a pointer. The header must be well-formed JSON of
// exactly that shape (no unknown fields, no duplicate keys, no number that is not an
// integer, UTF-8 only), every tensor's bytes must equal numel * dtype size, and the
// tensors must tile the data section exactly: no overlaps, no gaps, no trailing bytes
// (the reference reader rejects files with gaps too). Any broken input, truncated or
// corrupted anywhere, gives an error that names the file and the tensor or key; none
// crashes.
//
// Writing follows the reference writer byte for byte: compact JSON, "__metadata__"
// first (omitted when there is none), tensors ordered by dtype alignment, largest first,
// then by name (strcmp); the header is padded with spaces so the data starts 8-byte
// aligned, and tensors are packed back to back, so each tensor starts aligned to its
// element size. Metadata keys are written sorted (the reference writes a hash map's
// order); a file is a function of its tensors and metadata.
#ifndef NN_SAFETENSORS_H
#define NN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "tensor.h"

// Every dtype of the format, in the reference's order (increasing alignment): the
// writer orders tensors by this rank. DType (tensor.h) covers F32, F16, I64, I32, U8;
// the others can be read, listed and (floats) converted, not handed out as Tensors.
typedef enum StDType {
    ST_BOOL, ST_U8, ST_I8, ST_F8_E5M2, ST_F8_E4M3, ST_I16, ST_U16, ST_F16, ST_BF16,
    ST_I32, ST_U32, ST_F32, ST_F64, ST_I64, ST_U64, ST_DTYPE_COUNT
} StDType;
extern const char *const st_dtype_names[ST_DTYPE_COUNT];  // "BOOL", "U8", ...
extern const size_t st_dtype_sizes[ST_DTYPE_COUNT];       // bytes per element

#define ST_MAX_HEADER 100000000  // bytes; the reference's limit

// One tensor of an open file. data points into the file's mapping: read-only (a write
// through it crashes), valid until st_close, and aligned to the element size only if
// the writer aligned it (this module's writer and the reference's do); copy with
// memcpy, st_to_f32 or st_read_tensor rather than casting when in doubt.
typedef struct StEntry {
    char name[TENSOR_NAME_MAX];
    StDType dtype;
    int ndim;                         // 0 for a scalar
    int64_t shape[TENSOR_MAX_DIMS];   // non-negative
    const void *data;
    size_t offset;                    // data_offsets[0], from the start of the data section
    size_t bytes;                     // numel * st_dtype_sizes[dtype]
} StEntry;

typedef struct StMeta {
    const char *key, *value;  // NUL-terminated UTF-8, owned by the StFile
} StMeta;

// An open file. Read the public fields; the rest is private.
typedef struct StFile {
    char *path;         // as given to st_open, for messages
    StEntry *entries;   // sorted by name (strcmp)
    int count;
    StMeta *meta;       // the "__metadata__" pairs, sorted by key; NULL, 0 if none
    int nmeta;
    size_t file_bytes;  // 8 + header_bytes + data section
    size_t header_bytes;
    // private
    void *map;          // the mmap, or NULL for st_open_buffer
    char *strings;      // decoded metadata strings
} StFile;

// Maps the file read-only and validates it completely. On success f holds the entries
// and metadata until st_close(f). On failure f is left empty (st_close is harmless) and
// err names the file and what is wrong: "x.safetensors: tensor 'fc1.weight':
// data_offsets [0, 100] hold 100 bytes but F32 [64, 9216] needs 2359296 ...".
// The file must not be truncated by someone else while it is open (that would be
// SIGBUS on access, as for any mapping). st_write never does that: replacing the file
// with st_write while it is open is safe, the mapping keeps the old contents.
int st_open(StFile *f, const char *path, Error *err);
// The same on a buffer in memory; name is used in messages. buf must outlive f and not
// change while f is open. (Tests use it to fuzz with exact buffer bounds.)
int st_open_buffer(StFile *f, const void *buf, size_t size, const char *name, Error *err);
// Unmaps and frees; f is left empty. Harmless on an empty or already closed StFile.
void st_close(StFile *f);

// The entry with this name, or NULL. O(log count).
const StEntry *st_find(const StFile *f, const char *name);
// The metadata value for key, or NULL if absent.
const char *st_meta(const StFile *f, const char *key);

// Number of elements (1 for a scalar, 0 if a dimension is 0).
int64_t st_numel(const StEntry *e);
// The StDType for a DType (for comparing an entry against a Tensor).
StDType st_dtype_from(DType dt);

// A Tensor view of an entry (name, dtype, shape, data pointing into the mapping: it must
// not be written through; the cast drops const only because Tensor has no const view).
// Fails for dtypes that DType lacks (BF16, F64, ...), naming the tensor.
int st_as_tensor(const StFile *f, const StEntry *e, Tensor *out, Error *err);

// Converts an F32, F16, BF16 or F64 entry to float into dst (st_numel(e) floats). F64
// values out of float range become +-inf. Fails, naming the tensor, for other dtypes.
int st_to_f32(const StFile *f, const StEntry *e, float *dst, Error *err);

// Fills dst->data from the entry named dst->name. The shape must match dst's exactly;
// the data is copied when the dtypes match, converted when dst is F32 and the entry is
// F16, BF16 or F64; anything else is an error naming the file, the tensor, what it holds
// and what was expected. (The strict checkpoint loader lists all mismatches at once; this
// is the one-tensor building block.)
int st_read_tensor(const StFile *f, const Tensor *dst, Error *err);

// Writes tensors[0..n) and the metadata pairs meta_keys/meta_values[0..nmeta) to path,
// atomically: a temporary file path.tmp.<pid> in the same folder is written, flushed,
// fsynced and closed, renamed onto path, and the folder is fsynced. On any error the
// temporary file is removed, path is left as it was, and err names the path and the
// reason (an invalid tensor, an unwritable folder, a full disk); only if the last step,
// the folder's fsync, fails is path already replaced (the message says "wrote").
// Tensor data is read from host memory, raw, in the host's (little-endian) byte order;
// a tensor with a zero in its shape may have data NULL. Names must be unique,
// NUL-terminated within TENSOR_NAME_MAX, valid UTF-8 and not "__metadata__"; metadata
// keys must be unique and keys and values valid UTF-8. nmeta == 0 writes no
// "__metadata__". Sizes and offsets are 64-bit throughout (files over 4 GB). Two threads
// of one process must not write the same path at once (they would share the temporary
// file).
int st_write(const char *path, const Tensor *tensors, int n, const char *const *meta_keys,
             const char *const *meta_values, int nmeta, Error *err);

#endif
