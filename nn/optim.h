// optim.h: Adadelta (PyTorch's update and defaults) and the StepLR schedule.
#ifndef NN_OPTIM_H
#define NN_OPTIM_H

#include "net.h"

typedef struct Adadelta {
    double lr;            // 1.0: the base learning rate; the schedule scales it per epoch
    double rho;           // 0.9
    double eps;           // 1e-6
    double weight_decay;  // 0
} Adadelta;

// One step over all of the network's parameters with the gradients in net->grads and
// the state in net->optimizer (one kernel call: the blocks are contiguous).
void adadelta_step(const Net *net, const Adadelta *opt, double lr);

// StepLR with step_size 1: lr0 * gamma^epoch, multiplied out the way PyTorch's scheduler
// does it (one multiplication per epoch, in double).
double steplr(double lr0, double gamma, int epoch);

#endif
