/* The compile driver: from an optimised graph to a `.smelt` bundle, and the
 * runtime's view of an opened bundle and of a session for the tools built
 * on top of the public API (inspect, bench, the checkers in check.h).
 *
 * A bundle written here holds these sections (runtime/bundle.h):
 *   manifest    "key=value" lines: smelt version, compile options, LLVM
 *               version, target triple and CPU, default thread count
 *   ir-text     the final IR, as ir_print writes it
 *   graph       ir_graph_serialize: groups, memory plan, every constant
 *   kernels     the kernel table (encoding in driver.c), validated on load
 *               against the graph
 *   cpu-object  one ELF object with every kernel; named "TRIPLE/CPU"
 *
 * Ownership as in include/smelt.h: objects returned through out_ parameters
 * are owned by the caller.  Nothing here prints or exits.
 */
#ifndef SMELT_RT_DRIVER_H
#define SMELT_RT_DRIVER_H

#include <stddef.h>
#include <stdint.h>

#include "codegen/kernel.h"
#include "include/smelt.h"
#include "ir/ir.h"
#include "runtime/bundle.h"

/* The library's version, written into every bundle's manifest. */
#define SMELT_LIB_VERSION "0.1.0"
/* The version of the kernel-table encoding; the loader accepts exactly it. */
#define RT_KERNEL_TABLE_VERSION 1

typedef struct {
  const char *targets; /* "cpu"; NULL = "cpu".  Other targets are ST_UNSUPPORTED for now */
  const char *cpu;     /* LLVM CPU name; NULL = the host's */
  int threads;         /* default thread count recorded for sessions; 0 = number of cores */
  /* Recorded in the manifest only, so that a build can be reproduced: */
  const char *model;   /* the model file */
  const char *dims;    /* the dims overrides as given */
  const char *dtype;   /* the dtype override */
  const char *passes;  /* the pass list; NULL = the default pipeline */
  int64_t onchip_bytes;
} RtCompileOptions;

/* Lowers g (after the pass pipeline) to kernels, compiles them for the CPU
 * and writes the bundle to out_path (atomically).  g gains single-node
 * groups when the fuse pass formed none, and each unnamed group is named
 * after its kernel; it is otherwise unchanged.  o may be NULL. */
smelt_status rt_compile_graph(Graph *g, const RtCompileOptions *o, const char *out_path) SMELT_MUST_USE;
/* The same, with the bundle's bytes in a malloc'd buffer (free()). */
smelt_status rt_compile_graph_to_memory(Graph *g, const RtCompileOptions *o, void **out_buf,
                                        size_t *out_len) SMELT_MUST_USE;

/* Compiles g in memory and opens the result: what `smelt run MODEL.yaml
 * --device cpu` needs (the bundle is named after o->model in messages). */
smelt_status rt_bundle_from_graph(Graph *g, const RtCompileOptions *o, smelt_bundle **out_bundle) SMELT_MUST_USE;

/* smelt_compile without the file: YAML → passes → bundle bytes (free()). */
smelt_status rt_compile_model_to_memory(const char *model_path, const smelt_compile_options *options,
                                        void **out_buf, size_t *out_len) SMELT_MUST_USE;

/* ---- the kernel table ----
 * Encodes n kernels into a malloc'd buffer (free()). */
smelt_status rt_kernel_table_encode(const Kernel *k, int n, void **out_buf, size_t *out_len) SMELT_MUST_USE;
/* Decodes and validates a kernel table against the graph it runs: names,
 * groups, argument ids, that every kernel reads only values that exist by
 * then and writes only node results nobody else writes, that every graph
 * output is written, and that planned offsets lie inside the arena.
 * Messages start with "kernel table: ".  Release with rt_kernel_table_free. */
smelt_status rt_kernel_table_decode(const void *buf, size_t len, const Graph *g, Kernel **out_kernels,
                                    int *out_n) SMELT_MUST_USE;
void rt_kernel_table_free(Kernel *k, int n);

/* ---- an opened bundle (runtime/session.c) ---- */

/* Opens a bundle from memory (the bytes are copied); name is used in
 * messages.  Like smelt_bundle_open otherwise. */
smelt_status rt_bundle_open_bytes(const void *data, size_t len, const char *name,
                                  smelt_bundle **out_bundle) SMELT_MUST_USE;
/* Opens and validates a bundle without loading its machine code: enough to
 * inspect it (sessions cannot be created on it). */
smelt_status rt_bundle_open_nojit(const char *path, smelt_bundle **out_bundle) SMELT_MUST_USE;

const Graph *rt_bundle_graph(const smelt_bundle *b);
const RtBundle *rt_bundle_file(const smelt_bundle *b);
int rt_bundle_num_kernels(const smelt_bundle *b);
const Kernel *rt_bundle_kernel(const smelt_bundle *b, int i);
/* The manifest's value for key, NULL when absent (owned by the bundle). */
const char *rt_bundle_manifest_get(const smelt_bundle *b, const char *key);

/* The LLVM IR of kernel i (its functions, before optimisation), generated
 * again from the bundle's graph and kernel table; malloc'd (free()). */
smelt_status rt_bundle_kernel_llvm_ir(const smelt_bundle *b, int i, char **out_text) SMELT_MUST_USE;

/* ---- running a session kernel by kernel (bench, check) ---- */

/* Checks that every input and output is bound and resolves the pointer of
 * every kernel argument; must precede rt_session_run_kernel calls. */
smelt_status rt_session_prepare(smelt_session *s) SMELT_MUST_USE;
/* Runs kernel i on the session's thread pool. */
void rt_session_run_kernel(smelt_session *s, int i);
/* Copies graph outputs that no kernel writes (an input or a constant that
 * is also an output).  smelt_session_run = prepare, every kernel, this. */
void rt_session_finish(smelt_session *s);
/* Where value v lives during a run (after prepare): bound memory, constant
 * data, the arena or its own buffer; NULL for a value that lives only inside
 * a kernel. */
void *rt_session_value_data(const smelt_session *s, int v);
const smelt_bundle *rt_session_bundle(const smelt_session *s);
int rt_session_threads(const smelt_session *s);

#endif
