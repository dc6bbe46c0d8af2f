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
 *               (--target cpu)
 *   cuda-launch the CUDA launch table (cg_cuda_launch_encode): per kernel
 *               its symbol, unit, grid, block and shared memory, in kernel
 *               table order; validated on load against the kernel table
 *   cuda-source one CUDA C translation unit each, named "u0", "u1", ...
 *   cubin, ptx  each unit compiled by NVRTC for each requested arch, named
 *               "ARCH/UNIT" ("sm_90a/u0"); the PTX ends with its NUL
 *               (--target cuda; the kernels are generated with every
 *               argument 64-byte aligned, which sessions guarantee)
 *
 * Specialisations (SPEC §2, `--dim seq=1,16,64`): a bundle compiled for
 * several values of its dims holds one full set of the sections above per
 * combination (the cartesian product of the values, at most
 * RT_MAX_SPECIALISATIONS), each named under the prefix "sI/" ("s0/" for
 * graph, ir-text, kernels and cuda-launch; "s0/u0", "s0/sm_90a/u0",
 * "s0/TRIPLE/CPU" for the others), one manifest for all, and a
 * "specialisation" section, the index:
 *   "smelt-specialisations 1 N\n", then per specialisation I (in order)
 *   "sI/\tLABEL\tSIGNATURE\n"
 * where LABEL gives the dims that differ between the specialisations
 * ("seq=16", "seq=16 batch=2") and SIGNATURE the inputs it takes, as
 * rt_input_signature writes it ("x:f32[16,64] pos:i32[16]"); signatures are
 * distinct, which is how a run picks one from the shapes it is given.  A
 * bundle of one specialisation has no index and unprefixed names (the
 * layout of bundles before specialisations, which the same loader reads).
 * Constants are serialised in each specialisation's graph: those shared by
 * several specialisations are stored once per specialisation.
 *
 * Ownership as in include/smelt.h: objects returned through out_ parameters
 * are owned by the caller.  Nothing here prints or exits.
 */
#ifndef SMELT_RT_DRIVER_H
#define SMELT_RT_DRIVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codegen/kernel.h"
#include "frontend/frontend.h"
#include "include/smelt.h"
#include "ir/ir.h"
#include "runtime/bundle.h"

/* The library's version, written into every bundle's manifest. */
#define SMELT_LIB_VERSION "0.1.0"
/* The version of the kernel-table encoding; the loader accepts exactly it. */
#define RT_KERNEL_TABLE_VERSION 1

#define RT_MAX_CUDA_ARCHS 8

typedef struct {
  const char *targets; /* "cpu", "cuda", "cpu,cuda" (or "cuda,cpu"); NULL = "cpu" */
  const char *archs;   /* CUDA archs, "sm_90a,sm_80"; NULL = rt_cuda_default_arch() */
  const char *cpu;     /* LLVM CPU name; NULL = the host's */
  int threads;         /* default thread count recorded for sessions; 0 = number of cores */
  /* The tuning table (codegen/cuda/table.h) matmul/attention kernels look
   * their variant up in; NULL = heuristics only.  Its path is recorded in
   * the manifest and each kernel's variant in the CUDA launch table. */
  const char *tune_table;
  /* f32 matmuls may use the TF32 tensor cores (CgCudaOptions.allow_tf32);
   * recorded in the manifest. */
  bool allow_tf32;
  /* Notes while compiling (tuning-table misses); NULL = none. */
  void (*log)(void *ctx, const char *msg);
  void *log_ctx;
  /* Recorded in the manifest only, so that a build can be reproduced: */
  const char *model;   /* the model file */
  const char *dims;    /* the dims overrides as given */
  const char *dtype;   /* the dtype override */
  const char *passes;  /* the pass list; NULL = the default pipeline */
  int64_t onchip_bytes;
} RtCompileOptions;

/* Which targets a --target list names; ST_INVALID_INPUT for anything but
 * "cpu", "cuda", "cpu,cuda", "cuda,cpu" (NULL = "cpu"). */
smelt_status rt_parse_targets(const char *targets, bool *out_cpu, bool *out_cuda) SMELT_MUST_USE;
/* Checks a comma-separated --arch list ("sm_90a,sm_80"): at most
 * RT_MAX_CUDA_ARCHS real archs ("sm_XY" or "sm_XYa"), none twice. */
smelt_status rt_check_archs(const char *archs) SMELT_MUST_USE;
/* The CUDA arch to compile for when none is named: that of CUDA device 0
 * ("sm_90a" on an H100/H200), else "sm_90a".  Opens the driver to ask. */
void rt_cuda_default_arch(char *out, size_t cap);

/* Lowers g (after the pass pipeline) to kernels, compiles them for the
 * targets of o (CPU: LLVM; CUDA: CUDA C through NVRTC for every arch) and
 * writes the bundle to out_path (atomically).  Without LLVM (SMELT_LLVM=OFF)
 * the cpu target is ST_UNSUPPORTED; without NVRTC the cuda target is.  g gains single-node
 * groups when the fuse pass formed none, and each unnamed group is named
 * after its kernel; it is otherwise unchanged.  o may be NULL. */
smelt_status rt_compile_graph(Graph *g, const RtCompileOptions *o, const char *out_path) SMELT_MUST_USE;
/* The same, with the bundle's bytes in a malloc'd buffer (free()). */
smelt_status rt_compile_graph_to_memory(Graph *g, const RtCompileOptions *o, void **out_buf,
                                        size_t *out_len) SMELT_MUST_USE;

/* ---- specialisations ---- */

#define RT_MAX_SPECIALISATIONS 16
#define RT_MAX_DIMS 32
#define RT_SPEC_INDEX_MAGIC "smelt-specialisations"
#define RT_SPEC_INDEX_VERSION 1

/* The dims overrides of a compile, each with one or more values. */
typedef struct {
  int ndims;
  char *name[RT_MAX_DIMS];     /* malloc'd */
  int64_t *value[RT_MAX_DIMS]; /* nvalues[i] values each, malloc'd */
  int nvalues[RT_MAX_DIMS];
  int ncombos;                 /* the product of the nvalues, 1 when there are no dims */
} RtDimSpace;

/* Parses "seq=1,16;hidden=64" (NULL or "" = no dims).  A name given twice,
 * a value listed twice, a value that is not an integer, or more than
 * RT_MAX_SPECIALISATIONS combinations is ST_INVALID_INPUT.  Release with
 * rt_dim_space_free (also after an error: it is then empty). */
smelt_status rt_dim_space_parse(const char *text, RtDimSpace *out) SMELT_MUST_USE;
void rt_dim_space_free(RtDimSpace *d);
/* Combination i (0 <= i < ncombos; the first dim varies slowest) as
 * d->ndims FeDims whose names point into d. */
void rt_dim_space_combo(const RtDimSpace *d, int i, FeDim *out_dims);
/* Its label: the dims with several values, "seq=16 batch=2" ("" when none). */
void rt_dim_space_label(const RtDimSpace *d, int i, char *buf, size_t cap);
/* The inputs g takes, "x:f32[16,64] pos:i32[16]" (malloc'd; NULL when out
 * of memory). */
char *rt_input_signature(const Graph *g);

typedef struct {
  Graph *g;          /* after the pass pipeline */
  const char *label; /* rt_dim_space_label's; ignored when there is one */
} RtSpecGraph;

/* rt_compile_graph for n specialisations of one model (1 <= n <=
 * RT_MAX_SPECIALISATIONS): n == 1 writes the plain layout, more the
 * prefixed one with an index.  Specialisations taking the same input
 * shapes are ST_INVALID_INPUT. */
smelt_status rt_compile_specs(RtSpecGraph *specs, int n, const RtCompileOptions *o,
                              const char *out_path) SMELT_MUST_USE;
smelt_status rt_compile_specs_to_memory(RtSpecGraph *specs, int n, const RtCompileOptions *o, void **out_buf,
                                        size_t *out_len) SMELT_MUST_USE;

/* Compiles g in memory and opens the result: what `smelt run MODEL.yaml
 * --device cpu|cuda` needs (the bundle is named after o->model in messages). */
smelt_status rt_bundle_from_graph(Graph *g, const RtCompileOptions *o, smelt_bundle **out_bundle) SMELT_MUST_USE;

/* smelt_compile without the file: YAML → passes → bundle bytes (free()).
 * options->targets may name cuda; the arch is then rt_cuda_default_arch(). */
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
 * inspect it (sessions cannot be created on it).  Opening with code
 * (smelt_bundle_open) loads what this build can run: the CPU object when
 * there is one and LLVM is built in, and the CUDA launch table; a session
 * on a device the bundle has no code for is ST_UNSUPPORTED, saying why. */
smelt_status rt_bundle_open_nojit(const char *path, smelt_bundle **out_bundle) SMELT_MUST_USE;

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
smelt_status rt_bundle_match_inputs(const smelt_bundle *b, const char *const *names, const TensorType *shapes, int n,
                                    int *out_index) SMELT_MUST_USE;
/* Finds the section of that kind named `name` under b's prefix (NULL: the
 * first of the kind under it). */
bool rt_bundle_spec_find(const smelt_bundle *b, RtSectionKind kind, const char *name, const void **out_data,
                         size_t *out_len);

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
