/* The specialisation index of a bundle (SPEC §2, `--dim seq=1,16,64`).
 *
 * A bundle compiled for several values of its dims holds one full set of
 * sections per combination (the cartesian product of the values, at most
 * FMT_MAX_SPECIALISATIONS), each named under the prefix "sI/" ("s0/" for
 * graph, ir-text, kernels and cuda-launch; "s0/u0", "s0/sm_90a/u0",
 * "s0/TRIPLE/CPU" for the others), one manifest for all, and a
 * "specialisation" section, the index:
 *   "smelt-specialisations 1 N\n", then per specialisation I (in order)
 *   "sI/\tLABEL\tSIGNATURE\n"
 * where LABEL gives the dims that differ between the specialisations
 * ("seq=16", "seq=16 batch=2") and SIGNATURE the inputs it takes, as
 * fmt_input_signature writes it ("x:f32[16,64] pos:i32[16]"); signatures
 * are distinct, which is how a run picks one from the shapes it is given.
 * A bundle of one specialisation has no index and unprefixed names.  The
 * compiler writes the index (compiler/driver.c); the runtime reads it
 * (runtime/loader.c) and checks each entry against its graph. */
#ifndef SMELT_FMT_SPEC_INDEX_H
#define SMELT_FMT_SPEC_INDEX_H

#include "ir/ir.h"

#define FMT_MAX_SPECIALISATIONS 16
#define FMT_SPEC_INDEX_MAGIC "smelt-specialisations"
#define FMT_SPEC_INDEX_VERSION 1

/* The inputs g takes, "x:f32[16,64] pos:i32[16]" (malloc'd; NULL when out
 * of memory). */
char *fmt_input_signature(const Graph *g);

#endif
