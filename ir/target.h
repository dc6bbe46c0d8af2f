/* Facts about the machines smelt compiles for, which the passes, the code
 * generators and the runtime all need: CUDA arch names and limits, the
 * CPU's caches.  A leaf: it depends on nothing but libc. */
#ifndef SMELT_IR_TARGET_H
#define SMELT_IR_TARGET_H

#include <stdbool.h>

/* Parses "sm_90a" / "compute_80" into 90 / 80 (major*10+minor) and whether
 * it is an arch-specific ('a' or 'f') target; false when it is not an arch
 * name. */
bool ir_cuda_parse_arch(const char *arch, int *out_cc, bool *out_specific);

#endif
