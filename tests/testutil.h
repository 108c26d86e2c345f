// testutil.h: helpers shared by the test suites (linked into every tests/test_* binary).
#ifndef TESTS_TESTUTIL_H
#define TESTS_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "../data/dataset.h"
#include "../nn/net.h"
#include "../nn/optim.h"

// Big-endian 32-bit, as IDX headers store their magic and dimensions.
void put_be32(uint8_t *p, uint32_t v);

// A fresh directory $TMPDIR/<name>_XXXXXX (or under /tmp) written into dir; -1 if it
// cannot be made.
int test_tmpdir_make(char *dir, size_t size, const char *name);
// Removes path and everything under it; -1 on failure.
int test_remove_tree(const char *path);
// "DIR/NAME" in one of 4 rotating static buffers (so one call may take several).
const char *test_path(const char *dir, const char *name);
// The whole file (malloc'ed, with a NUL after its *n bytes); fails the test when it
// cannot be read.
void *test_read_file(const char *path, size_t *n);

// Runs a shell command line (printf-style, environment assignments allowed first) with its
// stdout and stderr in DIR/out.txt; returns its exit status (-1 if it did not exit).
int test_sh(const char *dir, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// DIR/out.txt as text (one static buffer of 64 KB; "" when there is none).
const char *test_sh_output(const char *dir);

// The repository root, for suites that read its files: left as it is when `probe` (a
// path relative to the root) is readable from the working directory (make test runs
// there), else the part of argv0's real path before its last "/build/"
// (build[/san]/tests/test_x).
void test_find_root(char *root, size_t size, const char *argv0, const char *probe);

// A seeded generator for test data (independent of the library's RNG).
void test_rng_seed(uint64_t seed);
uint64_t test_urand64(void);
double test_urand(void);  // [0, 1)

// count 8x8 images of 4 classes, written as IDX files <dir>/<name>-images and -labels
// (their paths into images and labels, PATH_MAX each): noise in [0, 80) and a bright 3x3
// square in the class's quadrant (top left, top right, bottom left, bottom right),
// jittered by a pixel. Draws from test_rng_seed(seed).
void write_squares(const char *dir, const char *name, int count, uint64_t seed, char *images,
                   char *labels);
// Writes a cfg at `path` that trains the squares sets of DIR ("train", "test": write_squares)
// with `batch`, one thread and seed 3, normalised as open_squares_loader does, through the
// layer sections `layers`. Returns 0, or -1 if it cannot be written.
int write_squares_cfg(const char *path, const char *dir, int batch, const char *layers);

// A squares set opened (into *ds, 4 classes checked) and its loader: batches of
// SQUARES_BATCH (30, which does not divide 512: an epoch ends with a partial batch),
// shuffled or not, normalised by mean 0.25 and std 0.35. Fails the test on error.
enum { SQUARES_BATCH = 30 };
Loader *open_squares_loader(const char *images, const char *labels, Dataset **ds, int shuffle);

// The activation block of net is sound: every buffer lies inside it, 64-byte aligned,
// apart from every buffer live at an event it is live at; the block holds the most bytes
// live at once, and (sharing by lifetime) is smaller than the buffers end to end; the
// input, labels, metrics and output are live through the step. Returns the most bytes
// live at once.
size_t expect_activation_layout(const Net *net);

// The workspace of a Winograd convolution (nn/conv.c) of OH x OW outputs, C -> OC channels,
// at batch B on the CPU's S shards (its threads): its transformed weight and weight
// gradient, 2 x 16 x OC x C floats, and for each shard a chunk of the most images n <=
// ceil(B / S) (at least 1) whose transformed input and output, 16 matrices of (tiles x C)
// and 16 of (tiles x OC) floats winograd_stride apart, take at most 1 MB (2 MB for one
// shard), tiles = n x ceil(OH / 2) x ceil(OW / 2); with several shards, each one's dU and
// dbias too, 16 x OC x C + OC floats rounded up to 64 bytes.
size_t winograd_workspace(int B, int OH, int OW, int C, int OC);

// One training step of net on the N samples (and labels) in its input buffer, as ./train
// takes it with accumulate = 1 in fp32: forward, loss and backward (dropout keyed by seed
// and step), with the update of `o` at `lr`: after backward over the zeroed gradient block
// (optim_step), or with net->fused_update during backward through net->hook, module by
// module (optim_step_module: train.c's hook without the ranks; the network zeroes a
// node's gradients before its backward). Returns the modules the hook updated (0 unfused); a hook left set or failed
// fails the test.
int test_train_step(Net *net, const Optimizer *o, int N, double lr, uint64_t seed, uint64_t step);

#endif
