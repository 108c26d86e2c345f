// resume.h: continuing a run from its checkpoint: the cfg stored in it, and which settings
// may differ from it.
#ifndef CLI_RESUME_H
#define CLI_RESUME_H

#include <stdbool.h>
#include <stddef.h>

#include "../nn/cfg.h"

// Compares the run's cfg with the one stored in checkpoint `ckpt`: a difference in a
// setting that changes the run is an error, unless force (then it is printed).
int resume_check(const Cfg *cfg, const char *ckpt, bool force, Error *err);

// ./train resume=CKPT [key=value ...]: the cfg stored in CKPT, the overrides applied; its
// checkpoints go on in CKPT's folder unless the cfg names one, and a stop_after that ended
// the stored run is dropped (give it again to stop again).
int cfg_from_checkpoint(Cfg *cfg, char *name, size_t cap, int argc, char **argv, Error *err);

#endif
