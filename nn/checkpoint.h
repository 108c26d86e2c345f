// checkpoint.h: training checkpoints as safetensors files (DESIGN.md decision 7).
//
// One file resumes training exactly or serves prediction alone:
//
//   tensors      the model's state_dict under PyTorch's names and layouts: parameters
//                ("conv1.weight" F32 [32, 1, 3, 3], "fc1.weight" F32 [64, 9216], ...) and
//                buffers ("bn1.running_mean" F32 [64], "bn1.num_batches_tracked" I64 []);
//                and the optimizer state under CHECKPOINT_OPTIMIZER_PREFIX:
//                "optimizer.conv1.weight.square_avg", "optimizer.conv1.weight.acc_delta".
//   __metadata__ strings: "format" = CHECKPOINT_FORMAT; "cfg" = the cfg text the run used
//                (command-line overrides applied); "classes" = class names, one per
//                line; "input" = the input shape "C,H,W"; and the TrainState fields below
//                under their own names.
//
// `./ckpt export` (checkpoint_export) writes the plain state_dict PyTorch loads, and any
// state_dict PyTorch saves as safetensors loads as weights (DESIGN.md decision 13).
// Loading is strict by name: a mismatch lists the missing keys, the unexpected keys and
// the keys whose shapes differ, and names the `./ckpt rename` command when the
// difference is a pure renaming.
#ifndef NN_CHECKPOINT_H
#define NN_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "net.h"
#include "optim.h"

#define CHECKPOINT_FORMAT "cnn.c-checkpoint-1"
#define CHECKPOINT_OPTIMIZER_PREFIX "optimizer."
#define CHECKPOINT_MAX_CLASSES (1 << 20)  // class names a checkpoint may list

// Where training stands. Stored in __metadata__ as decimal text (doubles with %.17g, so
// they read back bit for bit; "inf" for an infinity). The plateau's and early stopping's
// fields came later: a checkpoint without them reads as a run that has not seen a
// validation loss yet.
typedef struct TrainState {
    int64_t epoch;          // epochs completed
    int64_t batch;          // batches of epoch `epoch` completed (0 at an epoch boundary)
    uint64_t step;          // optimizer steps so far (keys the dropout masks)
    uint64_t seed;          // the run's seed
    double best_val_acc;    // best test accuracy so far, percent; -1 if none yet
    // Training totals of the unfinished epoch, so a resumed epoch reports the same
    // loss and accuracy as an uninterrupted one.
    double epoch_loss, epoch_correct;
    int64_t epoch_seen;
    // The loss scaler (nn/scaler.h): its scale, its clean steps since the last change and
    // the steps it skipped.
    double loss_scale;
    int64_t scaler_good_steps, scaler_skipped;
    // ReduceLROnPlateau's state (schedule = plateau), saved as "plateau_best",
    // "plateau_bad_epochs" and "lr_reductions".
    Plateau plateau;
    // The lowest validation loss so far and the epoch (1-based) that reached it, for early
    // stopping (patience): INFINITY and 0 before the first.
    double best_val_loss;
    int64_t best_val_loss_epoch;
} TrainState;

// Metadata a checkpoint carries besides the TrainState.
typedef struct CheckpointInfo {
    char *cfg_text;      // the cfg, as text
    char **class_names;  // classes entries
    int classes;
    Shape input;         // the network's input (C, H, W); checkpoint_save takes it from the net
} CheckpointInfo;

void checkpoint_info_free(CheckpointInfo *info);

// Writes net's parameters, buffers, optimizer state, st and info to path, atomically
// (st_write). Tensors are read from the device (net->k->download).
int checkpoint_save(const char *path, const Net *net, const TrainState *st,
                    const CheckpointInfo *info, Error *err);

// Reads the metadata of a checkpoint: its info (if info is non-NULL; caller frees with
// checkpoint_info_free) and its TrainState (if st is non-NULL). This is where every value
// of the metadata is validated, whatever the caller asks for: the format, the input shape
// (one images decode to: shape_is_input), 1 to CHECKPOINT_MAX_CLASSES class names as
// checkpoint_save writes them, a cfg that parses and agrees with the input, and a
// TrainState a run can reach. Errors name the file and the value.
int checkpoint_read_info(const char *path, CheckpointInfo *info, TrainState *st, Error *err);

// Loads the model's parameters and buffers into net (uploads to the device) from a cnn.c
// checkpoint or any safetensors file holding a plain state_dict (no metadata needed).
// Strict: every tensor of net must be in the file with its exact shape, and the file may
// hold no other model tensor (optimizer keys aside); only num_batches_tracked may be
// missing (it is then 0, as PyTorch does). The layers named in skip[0..nskip) (or modules
// above them: "fc", "layer4") are neither loaded nor expected: they keep what they have,
// and the file's tensors under those names are ignored whatever their shape. On a
// mismatch nothing is loaded and err lists the missing, unexpected and wrongly shaped
// keys (a few of each, with counts), and, when the unexpected keys map one-to-one onto
// the missing ones by one substring replacement, the command that fixes it:
// "./ckpt rename FILE NEW_FILE old=new". F16/BF16/F64 tensors are converted to F32; the
// counters must be I64.
int checkpoint_load_weights(const char *path, Net *net, const char *const *skip, int nskip,
                            Error *err);

// Loads parameters and buffers (as checkpoint_load_weights), the optimizer state (which
// must be there, strict in the same way) and the TrainState from a cnn.c checkpoint:
// everything a resume needs.
int checkpoint_load_all(const char *path, Net *net, TrainState *st, Error *err);

// Opens path as a safetensors file (errors name it) and says whether it is a cnn.c
// checkpoint (its metadata has a "format") or a plain state_dict.
int checkpoint_probe(const char *path, bool *is_checkpoint, Error *err);

// Writes the model's state_dict of checkpoint `in` (or any safetensors file) to `out`:
// every tensor but the optimizer state, as stored (parameters, batchnorm buffers and
// counters), and no metadata, the file PyTorch's load_state_dict(strict=True) takes as
// is. Refuses out == in; never modifies in. *ntensors = the tensors written.
int checkpoint_export(const char *in, const char *out, int *ntensors, Error *err);

// The rename rules of `./ckpt rename`.
typedef enum RenameMode {
    RENAME_SUBSTRING,  // OLD=NEW replaces every occurrence of OLD in a key (PyTorch recipe)
    RENAME_PREFIX,     // OLD=NEW replaces OLD at the start of a key only
    RENAME_WHOLE,      // OLD=NEW renames the module called exactly OLD (and its inner
                       // modules, OLD.*)
} RenameMode;

typedef struct RenameRule {
    const char *from, *to;
} RenameRule;

// Copies checkpoint `in` to `out` with its keys renamed: the rules apply in order to the
// layer part of each key (the name before ".weight"/".bias"; for optimizer keys the
// part after the prefix), and the same renaming applies to the layer names in the
// stored cfg, so the result loads into the renamed model. A plain state_dict (no cnn.c
// metadata: PyTorch's, DataParallel's "module." keys) is renamed the same way, its
// metadata copied. Refuses a renaming that makes
// two keys equal or leaves a layer name invalid, and out == in; never modifies in.
// *renamed = the number of keys changed (0 is not an error, but the CLI says so; then
// out is not written).
int checkpoint_rename(const char *in, const char *out, const RenameRule *rules, int nrules,
                      RenameMode mode, int *renamed, Error *err);

// The renaming of one key, as checkpoint_rename does it: writes the new key into out (cap
// bytes) and returns 1 if it differs from key, 0 if not, -1 if a rule's OLD is empty or
// the result does not fit. (The CLI prints "old -> new" with it.)
int checkpoint_rename_key(const char *key, const RenameRule *rules, int nrules, RenameMode mode,
                          char *out, size_t cap);

#endif
