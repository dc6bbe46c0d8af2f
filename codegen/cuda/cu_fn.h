/* The per-kernel state's life (fn.c): setting up a CuFn for a Kernel of a
 * graph, and the choice of a kernel's variant (forced, from the tuning
 * table, else the emitter's heuristic, logged as a table miss).  Above
 * cu_emit.h and the tuning table (table.h); below every emitter. */
#ifndef SMELT_CU_FN_H
#define SMELT_CU_FN_H

#include "codegen/cuda/cu_emit.h"

/* Generation state of kernel k; cu_fn_fini releases it, also
 * after a failed init. */
smelt_status cu_fn_init(CuFn *f, const Graph *g, const Kernel *k, const CgCudaOptions *opt, const char *force) SMELT_MUST_USE;
void cu_fn_fini(CuFn *f);

/* The variant this kernel must use (CgCudaOptions.force), or NULL. */
const char *cu_forced_variant(const CuFn *f);
/* Reports a table miss through CgCudaOptions.log. */
void cu_log(CuFn *f, const char *fmt, ...) SMELT_PRINTF(2, 3);

/* ---- variant selection (fn.c) ----
 * The variant token this kernel should use: the forced one, else the
 * tuning table's row for its shape (*out_from_table set), else NULL: the
 * emitter then uses its heuristic and calls cu_note_heuristic, which logs
 * the table miss.  Each emitter copies the token it used into l->variant. */
const char *cu_pick_variant(CuFn *f, bool *out_from_table);
void cu_note_heuristic(CuFn *f, const char *variant);
/* Whether Hopper-only variants (wgmma, TMA) may be used: opt->arch is an
 * 'a' arch of compute capability 9.0. */
bool cu_hopper(const CuFn *f);

#endif
