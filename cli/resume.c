// resume.c: the checks and the cfg of a resumed run (resume.h).
#include "resume.h"

#include <stdio.h>
#include <string.h>

#include "../nn/checkpoint.h"

// Keys that may change when a run resumes: they leave its numbers as they were (threads
// and device change the rounding, not the arithmetic; checkpointing, the fused update and
// recompute_1x1 change where memory goes, not a bit, and the gradient sum's buckets when it is summed;
// epochs and patience when it ends).
static bool resume_may_change(const char *section, const char *key) {
    static const char *const train[] = {"epochs", "save", "save_every", "stop_after", "threads",
                                        "device", "profile", "resume", "resume_force", "init",
                                        "init_skip", "checkpoint", "fused_update", "recompute_1x1",
                                        "patience", "bucket_mb"};
    static const char *const data[] = {"workers", "prefetch", "cache"};
    const bool is_train = !strcmp(section, "train"), is_data = !strcmp(section, "data");
    const char *const *keys = is_train ? train : data;
    const size_t n = is_train ? sizeof train / sizeof *train : is_data ? sizeof data / sizeof *data : 0;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(keys[i], key)) return true;
    return false;
}

int resume_check(const Cfg *cfg, const char *ckpt, bool force, Error *err) {
    CheckpointInfo info;
    if (checkpoint_read_info(ckpt, &info, NULL, err)) return -1;
    char name[1100];
    snprintf(name, sizeof name, "%s (its stored cfg)", ckpt);
    Cfg stored;
    int rc = -1;
    if (cfg_parse(&stored, info.cfg_text, name, err)) goto done;
    char diffs[900] = "";
    int ndiff = 0;
    if (stored.nsections != cfg->nsections) {
        snprintf(diffs, sizeof diffs, "; the checkpoint's network has %d sections, this cfg %d",
                 stored.nsections, cfg->nsections);
        ndiff++;
    }
    for (int i = 0; i < cfg->nsections && i < stored.nsections; i++) {
        const CfgSection *a = &stored.sections[i], *b = &cfg->sections[i];
        if (strcmp(a->name, b->name)) {
            snprintf(diffs + strlen(diffs), sizeof diffs - strlen(diffs),
                     "; section %d is [%s] in the checkpoint, [%s] here", i + 1, a->name, b->name);
            ndiff++;
            continue;
        }
        for (int pass = 0; pass < 2; pass++) {  // keys of the checkpoint's section, then new ones
            const CfgSection *x = pass ? b : a, *y = pass ? a : b;
            for (int j = 0; j < x->nentries; j++) {
                const CfgEntry *e = &x->entries[j], *f = cfg_entry(y, e->key);
                if ((pass && f) || (f && !strcmp(e->value, f->value)) || resume_may_change(a->name, e->key))
                    continue;
                const char *was = pass ? "(unset)" : e->value, *now = pass ? e->value : f ? f->value : "(unset)";
                snprintf(diffs + strlen(diffs), sizeof diffs - strlen(diffs), "; [%s] %s = %s, now %s",
                         a->name, e->key, was, now);
                ndiff++;
            }
        }
    }
    if (ndiff && !force) {
        err_set(err, "%s was trained with other settings%s: resuming needs the run's own (./train "
                     "resume=%s alone takes them from the checkpoint); resume_force=1 resumes with "
                     "the changes, no longer the same run", ckpt, diffs, ckpt);
        goto done;
    }
    if (ndiff) printf("resume_force: resuming %s with changed settings%s\n", ckpt, diffs);
    rc = 0;
done:
    cfg_free(&stored);
    checkpoint_info_free(&info);
    return rc;
}

int cfg_from_checkpoint(Cfg *cfg, char *name, size_t cap, int argc, char **argv, Error *err) {
    const char *ckpt = NULL;
    for (int i = 1; i < argc && !ckpt; i++)
        if (!strncmp(argv[i], "resume=", 7)) ckpt = argv[i] + 7;
    if (!ckpt)
        return err_set(err, "no cfg file: give one (./train CFG [key=value ...]), or resume=CKPT to "
                            "continue a run from its checkpoint alone");
    CheckpointInfo info;
    if (checkpoint_read_info(ckpt, &info, NULL, err)) return -1;
    snprintf(name, cap, "%s (its stored cfg)", ckpt);
    const int rc = cfg_parse(cfg, info.cfg_text, name, err);
    checkpoint_info_free(&info);
    if (rc) return -1;
    CfgSection *t = cfg_section(cfg, "train");
    if (t && cfg_entry(t, "stop_after") && cfg_set(t, "stop_after", "0", err)) return -1;
    if (t && !cfg_entry(t, "save")) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s", ckpt);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = '\0';
        else snprintf(dir, sizeof dir, ".");
        if (cfg_set(t, "save", dir, err)) return -1;
    }
    return 0;
}
