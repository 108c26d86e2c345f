#include "optim.h"

void adadelta_step(const Net *net, const Adadelta *opt, double lr) {
    net->k->adadelta_step(net->params, net_square_avg(net), net_acc_delta(net), net->grads,
                          net->nparams, (float)lr, (float)opt->rho, (float)opt->eps,
                          (float)opt->weight_decay);
}

double steplr(double lr0, double gamma, int epoch) {
    double lr = lr0;
    for (int e = 0; e < epoch; e++) lr *= gamma;
    return lr;
}
