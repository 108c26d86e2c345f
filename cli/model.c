// model.c: a trained network for --eval and --predict (model.h).
#include "model.h"

#include "../nn/budget.h"

#include <string.h>
#include <unistd.h>

void model_close(Model *m) {
    net_free(&m->net);
    data_close(&m->data);
    cfg_free(&m->cfg);
    checkpoint_info_free(&m->info);
}

int model_open(Model *m, const char *weights, const char *cfg_path, int noverrides,
               char **overrides, DataFiles data, Error *err) {
    memset(m, 0, sizeof *m);
    if (checkpoint_probe(weights, &m->is_checkpoint, err) ||
        (m->is_checkpoint && checkpoint_read_info(weights, &m->info, NULL, err)))
        return -1;
    if (cfg_path) {
        snprintf(m->name, sizeof m->name, "%s", cfg_path);
        if (cfg_load(&m->cfg, cfg_path, err)) return -1;
    } else if (m->is_checkpoint) {
        snprintf(m->name, sizeof m->name, "%s (its stored cfg)", weights);
        if (cfg_parse(&m->cfg, m->info.cfg_text, m->name, err)) return -1;
    } else {
        return err_set(err, "%s holds plain weights (a state_dict without cnn.c's metadata): give "
                            "the network's cfg with --cfg CFG", weights);
    }
    for (int i = 0; i < noverrides; i++)
        if (options_override(&m->cfg, overrides[i], err)) return -1;
    if (options_read(&m->o, &m->cfg, m->name,
                     data == DATA_FILES_NONE && !m->is_checkpoint ? DATA_FILES_ALL : data, err) ||
        !(m->k = kernels_for_device(m->o.device, err)))
        return -1;
    cpu_set_threads(m->o.threads > 0 ? m->o.threads : (int)sysconf(_SC_NPROCESSORS_ONLN));
    return 0;
}

int model_load(Model *m, const char *weights, Shape shape, int classes, int batch, size_t memory,
               Error *err) {
    // The plan first: a cfg (a checkpoint's, from anywhere) that asks for more than the
    // device can give is refused before anything of it is allocated.
    NetOptions opt = {.batch = batch, .precision = m->o.precision, .matmul = m->o.matmul,
                      .plan_only = true, .input_bytes = true};
    if (net_create(&m->net, &m->cfg, shape, classes, &opt, m->k, err)) return -1;
    const size_t need = mem_plan_on(&m->net.plan, m->k);
    net_free(&m->net);
    const char *source = "the limit given";
    size_t available = memory;
    if (!available && m->k->host_memory) {
        available = budget_machine_bytes(&source);
    } else if (!available) {
        size_t taken, baseline;
        m->k->device_memory(&available, &taken, &baseline);
        source = "the GPU's free memory";
    }
    if (need > available)
        return err_set(err, "%s: the network needs %.1f MB for batches of %d %dx%dx%d inputs, but "
                            "%.1f MB is %s; lower the batch (batch=N)", m->name, need / 1e6, batch,
                       shape.c, shape.h, shape.w, available / 1e6, source);
    opt.plan_only = false;
    return net_create(&m->net, &m->cfg, shape, classes, &opt, m->k, err) ||
                   checkpoint_load_weights(weights, &m->net, NULL, 0, err)
               ? -1
               : 0;
}
