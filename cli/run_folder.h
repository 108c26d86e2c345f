// run_folder.h: the save folder of a run (`save`), and what a new run does with an earlier
// run it finds there.
//
// A run's files are last.safetensors, best.safetensors, metrics.jsonl and curves.svg. A
// run that starts in a folder holding another run's files never replaces them: it moves
// them into SAVE/previous-N/ first (N = 1, 2, ...: the first number not taken) and says
// so. The move is renames only, into SAVE/previous-N.moving/, which is renamed to
// SAVE/previous-N/ when every file is in it: a trainer killed during the move leaves the
// .moving folder, and the next start in SAVE finishes that move before anything else.
#ifndef CLI_RUN_FOLDER_H
#define CLI_RUN_FOLDER_H

#include <stdbool.h>

#include "../nn/error.h"

// Whether the file at path lies directly in folder save (the same folder by device and
// inode, however the paths are spelled): a resume from it continues the run there.
bool run_folder_contains(const char *save, const char *path);

// Makes SAVE ready for a run, before anything is written there (rank 0 alone): creates it,
// finishes a move that a killed trainer left, removes the temporary files of trainers that
// no longer run (NAME.tmp.PID of the run's files), and, unless the run continues the one in
// SAVE (a resume from a checkpoint in it), moves an earlier run's files aside. Prints what
// it did. Errors name the file or folder.
int run_folder_prepare(const char *save, bool continues, Error *err);

#endif
