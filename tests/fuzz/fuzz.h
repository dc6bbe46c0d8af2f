/* What the libFuzzer targets of tests/fuzz share.
 *
 * The readers under test take paths (they map or read whole files), so each
 * input is written to a file in a directory of this process's own, made on
 * first use under $TMPDIR (or /dev/shm, a memory file system, when it
 * exists) and removed at exit.  A target names its files; a model that
 * refers to a side file by a relative name (YAML weights, ONNX external
 * data) finds at most the other inputs in that directory.
 *
 * A target's oracle is the library's own contract (include/smelt.h,
 * ir/status.h): bad input is an error status, never a crash, a hang or a
 * leak (ASan, UBSan and LeakSanitizer watch for those), and
 *   - the status has a message, and a code that is not ST_INTERNAL (an
 *     internal bug is an assert, not an error a file can cause);
 *   - a message for ST_INVALID_INPUT names the file it is about;
 *   - what a frontend accepts passes the IR verifier.
 * A broken rule aborts with the message, which libFuzzer reports as a crash
 * and saves the input for. */
#ifndef SMELT_FUZZ_H
#define SMELT_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "ir/status.h"

/* Writes size bytes at data to the file `name` of the process's directory
 * and returns its path (valid until the next call with the same name). */
const char *fuzz_put(const char *name, const void *data, size_t size);

/* Aborts, printing what rule was broken and the status's message. */
void fuzz_fail(const char *rule, const char *detail) __attribute__((noreturn));

/* Frees st after checking the rules above for an error status about path
 * (NULL: its message need not name a file).  The messages since
 * fuzz_last_error was emptied are kept there, joined by " | " (the replay
 * driver compares them with an expectation);
 * with $FUZZ_VERBOSE set it is printed. */
void fuzz_check_error(smelt_status st, const char *path);
extern char fuzz_last_error[1024];

/* Checks that g (accepted by a frontend) passes ir_verify and prints. */
void fuzz_check_graph(const Graph *g);

#endif
