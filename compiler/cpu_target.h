/* Which CPU the CPU backend builds code for, and what that code needs.
 *
 * `--cpu` takes a comma-separated list of CPU variants; each becomes one
 * object in the bundle and the runtime loads the first whose features the
 * machine has (runtime/loader.c), so the list is sorted here most capable
 * first.  A variant is:
 *   native (or no --cpu)       this machine: LLVM's host CPU and features;
 *   x86-64, x86-64-v2/v3/v4    the psABI levels: exactly their features;
 *   a named CPU (znver3, ...)  scheduled for that CPU, with the features
 *                              of its level and its own extensions;
 * anything else is an error listing the known names (LLVM would otherwise
 * abort on it).  Each variant records the features its code may use, in
 * the manifest as "cpu_features:NAME", for the runtime to check.
 */
#ifndef SMELT_COMPILER_CPU_TARGET_H
#define SMELT_COMPILER_CPU_TARGET_H

#include <stddef.h>

#include "ir/status.h"

#define SC_MAX_CPU_VARIANTS 4

typedef struct {
  char name[48];       /* the variant's name in the bundle: "x86-64-v3", "znver3" (the host's for native) */
  char llvm_cpu[48];   /* what LLVM is told */
  char *features;      /* LLVM feature string ("+avx2,+fma,-avx512f"), malloc'd */
  char *needs;         /* the features the code may use ("+avx2,+fma"), malloc'd */
} ScCpuVariant;

typedef struct {
  int n;
  ScCpuVariant v[SC_MAX_CPU_VARIANTS];
} ScCpuTargets;

/* Parses a --cpu list (NULL or "" = native) into variants, most capable
 * first.  An unknown name is ST_INVALID_INPUT listing the known ones; a
 * name twice, or more than SC_MAX_CPU_VARIANTS, too.  Release with
 * sc_cpu_targets_free (also after an error). */
smelt_status sc_cpu_targets_parse(const char *list, ScCpuTargets *out) SMELT_MUST_USE;
void sc_cpu_targets_free(ScCpuTargets *t);
/* The known names, space-separated (a static string). */
const char *sc_cpu_known_names(void);
/* Whether LLVM may be handed `name` as a CPU: one of the known names, or
 * this machine's CPU as LLVM names it (what a native variant records).  A
 * name LLVM does not know makes it print to stderr and, with some feature
 * strings, abort ("64-bit code requested on a subtarget that doesn't
 * support it!"). */
bool sc_cpu_name_known(const char *name);

#endif
