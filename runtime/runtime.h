/* The runtime's inside view of an opened bundle and of a session, for the
 * tools built on top of the public API (compiler/check.c, smelt inspect and
 * bench).  Everything here is in libsmelt_runtime.
 *
 * Ownership as in include/smelt.h: objects returned through out_ parameters
 * are owned by the caller.  Nothing here prints or exits.
 */
#ifndef SMELT_RT_RUNTIME_H
#define SMELT_RT_RUNTIME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/bundle.h"
#include "format/kernel.h"
#include "format/spec_index.h"
#include "include/smelt.h"
#include "ir/ir.h"

/* The library's version, written into every bundle's manifest. */
#define SMELT_LIB_VERSION "0.2.0"


/* ---- an opened bundle (runtime/session.c) ---- */

/* Opens a bundle from memory (the bytes are copied); name is used in
 * messages.  Like smelt_bundle_open otherwise. */
smelt_status rt_bundle_open_bytes(const void *data, size_t len, const char *name,
                                  smelt_bundle **out_bundle) SMELT_MUST_USE;
/* Opens and validates a bundle without loading its machine code: enough to
 * inspect it (sessions cannot be created on it).  Opening with code
 * (smelt_bundle_open) loads what this build can run: the CPU object when
 * there is one and LLVM is built in, and the CUDA launch table; a session
 * on a device the bundle has no code for is ST_UNSUPPORTED, saying why. */
smelt_status rt_bundle_open_nojit(const char *path, smelt_bundle **out_bundle) SMELT_MUST_USE;
/* Checks len bytes at data as opening them with their code does (the CPU
 * object linked, the CUDA launch table decoded) plus the checks opening
 * defers to the first session (the constants' and external weights'
 * content), without running any of the bundle's code (smelt_bundle_open
 * runs its weight-packing functions), and closes the bundle again.  For
 * the fuzzers (tests/fuzz). */
smelt_status rt_bundle_check_bytes(const void *data, size_t len, const char *name) SMELT_MUST_USE;

/* Specialisations: an opened bundle is its first specialisation (so the
 * functions below give that one's graph and kernels); rt_bundle_spec(b, i)
 * is specialisation i, a smelt_bundle owned by b's root that every
 * function here takes (sessions take the root). */
int rt_bundle_num_specs(const smelt_bundle *b);
const smelt_bundle *rt_bundle_spec(const smelt_bundle *b, int i);
/* "seq=16" ("" in a bundle of one). */
const char *rt_bundle_spec_label(const smelt_bundle *b);
/* The index of the specialisation whose dims have the values that `dims`
 * gives ("seq=16", several separated by ';' or ' '); a bundle of one
 * matches dims it was compiled with (its manifest's) and nothing else.
 * ST_INVALID_INPUT listing the specialisations when none matches. */
smelt_status rt_bundle_find_spec(const smelt_bundle *b, const char *dims, int *out_index) SMELT_MUST_USE;
/* The specialisation that takes inputs of these shapes (n named inputs,
 * the others unconstrained; the dtypes are not compared); errors as for
 * smelt_session_bind_input_shaped, and when several fit. */
/* Ranged dims (ir.h: TensorType.dyn): the value d of the range of graph g
 * that gives ranged axis a of t the extent e, into rv[range] (-1: not
 * known yet).  False when no d in the range does, or rv already holds
 * another value. */
bool rt_solve_range(const Graph *g, const TensorType *t, int a, int64_t e, int64_t *rv);

smelt_status rt_bundle_match_inputs(const smelt_bundle *b, const char *const *names, const TensorType *shapes, int n,
                                    int *out_index) SMELT_MUST_USE;
/* Finds the section of that kind named `name` under b's prefix (NULL: the
 * first of the kind under it). */
bool rt_bundle_spec_find(const smelt_bundle *b, FmtSectionKind kind, const char *name, const void **out_data,
                         size_t *out_len);

/* Tensor parallelism (--tp): the ranks of b's bundle (1 without), and
 * specialisation `spec` of rank `rank` (rank 0's is rt_bundle_spec). */
int rt_bundle_num_ranks(const smelt_bundle *b);
const smelt_bundle *rt_bundle_rank_spec(const smelt_bundle *b, int rank, int spec);

const Graph *rt_bundle_graph(const smelt_bundle *b);
const FmtFile *rt_bundle_file(const smelt_bundle *b);
int rt_bundle_num_kernels(const smelt_bundle *b);
const Kernel *rt_bundle_kernel(const smelt_bundle *b, int i);
/* The loaded CPU object of b (runtime/elf_loader.h), NULL when b was
 * opened without machine code or has none. */
const struct RtElfImage *rt_bundle_code_image(const smelt_bundle *b);
/* The manifest's value for key, NULL when absent (owned by the bundle). */
const char *rt_bundle_manifest_get(const smelt_bundle *b, const char *key);


/* ---- running a session kernel by kernel (bench, check) ---- */

/* Checks that every input and output is bound and resolves the pointer of
 * every kernel argument; must precede rt_session_run_kernel calls.  On
 * CUDA it also copies the inputs to the device where they are staged. */
smelt_status rt_session_prepare(smelt_session *s) SMELT_MUST_USE;
/* Runs kernel i: on the CPU on the session's thread pool (it cannot fail);
 * on CUDA a launch and a wait, an error naming the kernel. */
smelt_status rt_session_run_kernel(smelt_session *s, int i) SMELT_MUST_USE;
/* Copies graph outputs that no kernel writes (an input or a constant that
 * is also an output), and on CUDA every output the user's memory does not
 * hold yet.  smelt_session_run = prepare, every kernel, this (on CUDA the
 * kernels as one CUDA graph, captured once). */
smelt_status rt_session_finish(smelt_session *s) SMELT_MUST_USE;
/* CPU sessions: where value v lives during a run (after prepare): bound
 * memory, constant data, the arena or its own buffer; NULL for a value that
 * lives only inside a kernel, and on CUDA sessions (use the next). */
void *rt_session_value_data(const smelt_session *s, int v);
/* Value v's current data in host memory (after prepare): on the CPU where
 * it lives, on CUDA a copy downloaded now into a buffer the session owns
 * (valid until the next call for v or the session's end).  *out_data is
 * NULL for a value that lives only inside a kernel. */
smelt_status rt_session_read_value(smelt_session *s, int v, const void **out_data) SMELT_MUST_USE;
const smelt_bundle *rt_session_bundle(const smelt_session *s);
/* CPU worker threads; 0 on a CUDA session. */
int rt_session_threads(const smelt_session *s);

/* ---- CUDA sessions (bench) ---- */

struct RtCudaDevice;
/* The session's device, NULL on a CPU session. */
struct RtCudaDevice *rt_session_cuda_device(smelt_session *s);
/* How each compilation unit was loaded ("cubin sm_90a", "nvrtc sm_90a",
 * "ptx sm_80"), one per unit separated by ", ", into buf. */
void rt_session_cuda_loaded(const smelt_session *s, char *buf, size_t cap);
/* Times every kernel with CUDA events, `iters` times over (each after an
 * untimed pass); out_ms[k * iters + i] is kernel k in pass i, in ms.
 * Needs a run (or prepare) first. */
smelt_status rt_session_cuda_time_kernels(smelt_session *s, int iters, double *out_ms) SMELT_MUST_USE;
/* Replays the session's CUDA graph `batch` times back to back and waits,
 * `reps` times over; out_ms[r] is the wall time of rep r over batch, in ms
 * (queueing replays hides the launch latency of all but the first).  Needs
 * smelt_session_run first (which captures the graph). */
smelt_status rt_session_cuda_time_graph(smelt_session *s, int reps, int batch, double *out_ms) SMELT_MUST_USE;

#endif
