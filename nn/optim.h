// optim.h: the optimizers (PyTorch's updates and defaults) and the learning-rate schedule.
//
// Each trained parameter tensor (frozen ones have none) keeps optim_nstates() state
// tensors of its shape in net->optimizer, saved in checkpoints as
// "optimizer.<parameter>.<state name>" (PyTorch's names for them): F32, or compressed
// (Optimizer.state_format, nn/quant.h) BF16, or U8 codes with their blocks' absmax in
// "optimizer.<parameter>.<state name>_absmax" (F32; the averages of squares as their square
// roots, which the metadata's "int8_roots" lists).
#ifndef NN_OPTIM_H
#define NN_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "net.h"

typedef enum OptimKind { OPTIM_ADADELTA, OPTIM_SGD, OPTIM_ADAMW, OPTIM_COUNT } OptimKind;
extern const char *const optim_names[OPTIM_COUNT];  // "adadelta", "sgd", "adamw"

typedef struct Optimizer {
    OptimKind kind;
    double lr;                  // the base learning rate; the schedule scales it per step
    double weight_decay;        // adadelta, sgd: weight_decay * p added to the gradient;
                                // adamw: decoupled, p *= 1 - lr * weight_decay
    bool decay_skip_norm_bias;  // no weight decay for 1-D parameters (biases, batchnorm)
    double rho;                 // adadelta: 0.9
    double eps;                 // adadelta: 1e-6; adamw: 1e-8
    double momentum, dampening; // sgd: 0, 0
    bool nesterov;              // sgd
    double beta1, beta2;        // adamw: 0.9, 0.999
    StateFormat state_format;   // how the state is stored (nn/quant.h): fp32, bf16, int8
    double clip_grad_norm;      // > 0: the gradients are scaled down to this norm first
                                // (torch.nn.utils.clip_grad_norm_); 0: none
} Optimizer;

// The state tensors of each trained parameter, and their names: adadelta square_avg and
// acc_delta; sgd momentum_buffer (none without momentum); adamw exp_avg and exp_avg_sq.
int optim_nstates(const Optimizer *o);
const char *const *optim_state_names(const Optimizer *o);
// Whether a state of that name holds only values >= 0 (it averages squares: adadelta's
// square_avg and acc_delta, adamw's exp_avg_sq); a checkpoint's negative ones are refused.
bool optim_state_nonnegative(const char *state_name);
// Sets opt's optimizer state count, names and format (the network plans, names and
// stores the state).
void optim_plan(const Optimizer *o, NetOptions *opt);

// One optimizer step at step `step` of the run (from 0; every step counted, skipped ones
// too) over the gradients in net->grads, with learning rate `lr`. With loss scaling
// (`scaling` non-NULL: precision = fp16) the gradients are first unscaled and checked
// against net->scaler, the step is skipped if one is not finite, and the scaler's state is
// updated by its rules: all on the device, in the order of its queue, so nothing waits for
// the host. Adamw's bias correction and sgd's first momentum buffer count the steps the
// optimizer took (step less the skipped ones, from net->scaler). Not for a network with
// fused_update: its modules were updated during backward (optim_step_module), and it
// has no gradient block (each node's gradients live in the activation block). With o->clip_grad_norm, the gradients
// (unscaled) are first multiplied by max_norm / (norm + 1e-6) when that is below 1, norm
// being the 2-norm of all of them, as torch.nn.utils.clip_grad_norm_ does (Kernels.
// sum_squares and clip_scale, on the device; its square stays in net->grad_sumsq).
void optim_step(const Net *net, const Optimizer *o, const ScalerRules *scaling, double lr,
                uint64_t step);
// The same update for module m's trained tensors alone (none when it is frozen), from the
// gradients in m->grads: the fused update (NetOptions.fused_update) calls it per module
// during backward. fp32 only (no loss scaling). The result is optim_step's, bit for bit:
// an element's arithmetic does not depend on which tensors share a kernel call. The
// gradients are read, not zeroed (net_backward zeroes a node's before its backward).
void optim_step_module(const Net *net, const Optimizer *o, const Layer *m, double lr,
                       uint64_t step);

// The learning rate over a run, as PyTorch's schedulers give it: StepLR stepped after
// every epoch, CosineAnnealingLR and OneCycleLR after every batch, ReduceLROnPlateau after
// every epoch on the validation loss.
typedef enum ScheduleKind {
    SCHEDULE_STEP,
    SCHEDULE_COSINE,
    SCHEDULE_ONECYCLE,
    SCHEDULE_PLATEAU,
    SCHEDULE_COUNT
} ScheduleKind;
extern const char *const schedule_names[SCHEDULE_COUNT];  // "step", "cosine", "onecycle", "plateau"

typedef struct Schedule {
    ScheduleKind kind;
    double gamma;          // step: StepLR(step_size=1, gamma), the lr times gamma each epoch
    double lr_min;         // cosine: CosineAnnealingLR's eta_min; plateau: its min_lr
    int64_t warmup;        // steps of linear warmup first (LinearLR), 0 = none (step, cosine)
    double warmup_start;   // LinearLR's start_factor: the fraction of lr at step 0
    int64_t total;         // cosine, onecycle: the run's steps (warmup included)
    // onecycle: OneCycleLR(max_lr = the optimizer's lr, total_steps = total, pct_start,
    // anneal_strategy 'cos', div_factor, final_div_factor, three_phase False, and with
    // cycle_momentum its base_momentum and max_momentum).
    double pct_start, div_factor, final_div_factor;
    bool cycle_momentum;
    double base_momentum, max_momentum;
    // plateau: ReduceLROnPlateau(mode 'min', factor, patience, threshold 1e-4 relative,
    // cooldown 0, min_lr = lr_min, eps 1e-8) on the validation loss.
    double factor;
    int64_t patience;
} Schedule;

// What ReduceLROnPlateau keeps between epochs (a checkpoint's TrainState holds it). A run
// starts from {.best = INFINITY}.
typedef struct Plateau {
    double best;         // the lowest validation loss by its threshold (PyTorch's best)
    int64_t bad_epochs;  // epochs since (num_bad_epochs)
    int64_t reductions;  // times it has reduced the learning rate
} Plateau;

// The learning rate of step t (0-based, every batch of the run counted) in epoch `epoch`,
// base lr0, after `reductions` of the plateau's (Plateau.reductions; 0 for the other
// schedules). step: lr0 * gamma^epoch (the multiplications PyTorch does, in order), times
// the warmup factor w(t) = warmup_start + (1 - warmup_start) * t / warmup while t <
// warmup. cosine: lr0 * w(t) during the warmup, then lr_min + (lr0 - lr_min) * (1 +
// cos(pi * (t - warmup) / (total - warmup))) / 2 (PyTorch's SequentialLR of LinearLR and
// CosineAnnealingLR, milestone `warmup`). onecycle: OneCycleLR's, lr0 its max_lr: from
// lr0 / div_factor up to lr0 over the first pct_start * total steps, then down to lr0 /
// div_factor / final_div_factor at step total - 1, each a cosine half-wave in PyTorch's
// arithmetic. plateau: lr0 multiplied by factor `reductions` times, never below lr_min.
double schedule_lr(const Schedule *s, double lr0, int64_t t, int epoch, int64_t reductions);

// The optimizer that step t runs: o, with schedule = onecycle and cycle_momentum SGD's
// momentum or AdamW's beta1 (betas[0]) as OneCycleLR sets it for step t: from
// max_momentum down to base_momentum while the lr rises, and back up while it falls.
// (Adadelta has neither: options refuse cycle_momentum with it, as PyTorch does.)
Optimizer schedule_optimizer(const Schedule *s, const Optimizer *o, int64_t t);

// ReduceLROnPlateau.step(loss) after an epoch with validation loss `loss`, base lr lr0: an
// epoch improves when its loss is below best * (1 - 1e-4); after more than `patience`
// epochs without, the lr is multiplied by factor (never below lr_min; a change of 1e-8 or
// less is none) and the count starts again. Returns whether it reduced the lr.
bool plateau_step(const Schedule *s, Plateau *p, double lr0, double loss);

#endif
