/* The compile driver: from an optimised graph to a `.smelt` bundle.
 *
 * A bundle written here holds these sections (runtime/bundle.h):
 *   manifest    "key=value" lines: smelt version, compile options, LLVM
 *               version, target triple and CPU, default thread count
 *   ir-text     the final IR, as ir_print writes it
 *   graph       ir_graph_serialize: groups, memory plan, constants by
 *               reference (offset, size) into the constants section
 *   constants   every used constant of every specialisation, once per
 *               distinct content, 64-byte aligned (format/constants.h)
 *   weights     with external_weights: the safetensors files and the
 *               recipes of the constants taken from them (format/weights.h)
 *   kernels     the kernel table (encoding in driver.c), validated on load
 *               against the graph
 *   cpu-object  one ELF object with every kernel; named "TRIPLE/CPU"
 *               (--target cpu)
 *   cuda-launch the CUDA launch table (fmt_cuda_launch_encode): per kernel
 *               its symbol, unit, grid, block and shared memory, in kernel
 *               table order; validated on load against the kernel table
 *   cuda-source one CUDA C translation unit each, named "u0", "u1", ...
 *   cubin, ptx  each unit compiled by NVRTC for each requested arch, named
 *               "ARCH/UNIT" ("sm_90a/u0"); the PTX ends with its NUL
 *               (--target cuda; the kernels are generated with every
 *               argument 64-byte aligned, which sessions guarantee)
 *
 * Specialisations: format/spec_index.h.
 *
 * Ownership as in include/smelt.h: objects returned through out_ parameters
 * are owned by the caller.  Nothing here prints or exits.
 */
#ifndef SMELT_COMPILER_DRIVER_H
#define SMELT_COMPILER_DRIVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/bundle.h"
#include "format/kernel.h"
#include "frontend/frontend.h"
#include "include/smelt_compile.h"
#include "ir/ir.h"
#include "runtime/runtime.h"


/* Where a compile's back half spent its time (wall seconds, summed over
 * specialisations): `smelt compile --time` prints it. */
typedef struct {
  double lower_s;     /* groups into kernels (cg_lower) */
  double cpu_s;       /* LLVM: IR, optimisation, machine code, every CPU variant */
  double cuda_gen_s;  /* the CUDA C of every kernel */
  double nvrtc_s;     /* NVRTC (or the disk cache), every unit and arch */
  double graph_s;     /* serialising the graphs, pooling their constants (checksums) */
  double write_s;     /* laying out, checksumming and writing the bundle */
} ScCompileTimes;

typedef struct {
  const char *targets; /* "cpu", "cuda", "cpu,cuda" (or "cuda,cpu"); NULL = "cpu" */
  const char *archs;   /* CUDA archs, "sm_90a,sm_80"; NULL = sc_cuda_default_arch() */
  const char *cpu;     /* LLVM CPU name; NULL = the host's */
  int threads;         /* default thread count recorded for sessions; 0 = number of cores */
  /* The tuning table (codegen/cuda/table.h) matmul/attention kernels look
   * their variant up in; NULL = heuristics only.  Its path is recorded in
   * the manifest and each kernel's variant in the CUDA launch table. */
  const char *tune_table;
  /* f32 matmuls may use the TF32 tensor cores (CgCudaOptions.allow_tf32);
   * recorded in the manifest. */
  bool allow_tf32;
  /* Constants whose bytes are tensors of the model's safetensors files (or
   * merge-matmuls' strided copies of them: Value.source) are not stored;
   * the bundle's weights section names the files by path and content hash
   * (format/weights.h) and the runtime maps them at load. */
  bool external_weights;
  /* Notes while compiling (tuning-table misses); NULL = none. */
  void (*log)(void *ctx, const char *msg);
  void *log_ctx;
  /* Recorded in the manifest only, so that a build can be reproduced: */
  const char *model;   /* the model file */
  const char *dims;    /* the dims overrides as given */
  const char *dtype;   /* the dtype override */
  const char *passes;  /* the pass list; NULL = the default pipeline */
  int64_t onchip_bytes;
  const char *quantize; /* --quantize and its options as given ("int4 group=128"); NULL = none */
  ScCompileTimes *times; /* when non-NULL, the back half's times are added to it */
  /* Tensor parallelism (--tp): > 1 makes a bundle of tp ranks, whose
   * specialisations sc_compile_specs takes rank-major (n per rank, tp * n
   * in all), each rank's made by the pipeline with the shard pass. */
  int tp;
} ScCompileOptions;

/* Which targets a --target list names; ST_INVALID_INPUT for anything but
 * "cpu", "cuda", "cpu,cuda", "cuda,cpu" (NULL = "cpu"). */
smelt_status sc_parse_targets(const char *targets, bool *out_cpu, bool *out_cuda) SMELT_MUST_USE;
/* Checks a comma-separated --arch list ("sm_90a,sm_80"): at most
 * FMT_MAX_CUDA_ARCHS real archs ("sm_XY" or "sm_XYa"), none twice. */
smelt_status sc_check_archs(const char *archs) SMELT_MUST_USE;
/* The CUDA arch to compile for when none is named: that of CUDA device 0
 * ("sm_90a" on an H100/H200), else "sm_90a".  Opens the driver to ask. */
void sc_cuda_default_arch(char *out, size_t cap);

/* Lowers g (after the pass pipeline) to kernels, compiles them for the
 * targets of o (CPU: LLVM; CUDA: CUDA C through NVRTC for every arch) and
 * writes the bundle to out_path (atomically).  Without LLVM (SMELT_LLVM=OFF)
 * the cpu target is ST_UNSUPPORTED; without NVRTC the cuda target is.  g gains single-node
 * groups when the fuse pass formed none, and each unnamed group is named
 * after its kernel; it is otherwise unchanged.  o may be NULL. */
smelt_status sc_compile_graph(Graph *g, const ScCompileOptions *o, const char *out_path) SMELT_MUST_USE;
/* The same, with the bundle's bytes in a malloc'd buffer (free()). */
smelt_status sc_compile_graph_to_memory(Graph *g, const ScCompileOptions *o, void **out_buf,
                                        size_t *out_len) SMELT_MUST_USE;

/* ---- specialisations ---- */

#define SC_MAX_DIMS 32


/* The dims overrides of a compile, each with one or more values. */
typedef struct {
  int ndims;
  char *name[SC_MAX_DIMS];     /* malloc'd */
  int64_t *value[SC_MAX_DIMS]; /* nvalues[i] values each, malloc'd */
  int64_t *vmax[SC_MAX_DIMS];  /* per value: the max of a range value..max, else the value */
  int nvalues[SC_MAX_DIMS];
  int ncombos;                 /* the product of the nvalues, 1 when there are no dims */
} ScDimSpace;

/* Parses "seq=1,16;hidden=64" (NULL or "" = no dims); a value may be a
 * range "2..2048" (one specialisation that takes any value in it).  A name given twice,
 * a value listed twice, a value that is not an integer, or more than
 * FMT_MAX_SPECIALISATIONS combinations is ST_INVALID_INPUT.  Release with
 * sc_dim_space_free (also after an error: it is then empty). */
smelt_status sc_dim_space_parse(const char *text, ScDimSpace *out) SMELT_MUST_USE;
void sc_dim_space_free(ScDimSpace *d);
/* Combination i (0 <= i < ncombos; the first dim varies slowest) as
 * d->ndims FeDims whose names point into d. */
void sc_dim_space_combo(const ScDimSpace *d, int i, FeDim *out_dims);
/* Its label: the dims with several values, "seq=16 batch=2" ("" when none). */
void sc_dim_space_label(const ScDimSpace *d, int i, char *buf, size_t cap);

/* Builds the graph of one assignment of exact dims (frontend and pass
 * pipeline); probe: a build only for compiler/ranges.c to compare shapes
 * (no dumps or notes wanted). */
typedef smelt_status (*ScBuildFn)(void *ctx, const FeDim *dims, int ndims, bool probe, Graph **out);

/* Ranged dims (SPEC §2): builds the graph with every range at its max,
 * whether the range comes from dims (FeDim.max) or from the model (a YAML
 * `seq: {max: N}` not overridden), then builds it again at other values of
 * each range and marks every axis whose extent follows the range
 * (TensorType.dyn: extent a * d + b, checked at three values), recording
 * the ranges in (*out)->ranges.  Without ranges it is one build.  A model
 * whose graphs differ in structure between the values, or whose extents do
 * not follow a range affinely, is ST_UNSUPPORTED naming the value. */
smelt_status sc_build_ranged(ScBuildFn build, void *ctx, const FeDim *dims, int ndims, Graph **out) SMELT_MUST_USE;

typedef struct {
  Graph *g;          /* after the pass pipeline */
  const char *label; /* sc_dim_space_label's; ignored when there is one */
  /* the quantize pass's report (pass_quant_report_text), stored as the
   * specialisation's quant-report section; NULL = none */
  const char *quant_report;
  /* --tp: the states the shard pass stored split (PassCtx.tp_states), for
   * the manifest; NULL = none */
  const char *tp_states;
} ScSpecGraph;

/* sc_compile_graph for n specialisations of one model (1 <= n <=
 * FMT_MAX_SPECIALISATIONS): n == 1 writes the plain layout, more the
 * prefixed one with an index.  Specialisations taking the same input
 * shapes are ST_INVALID_INPUT. */
smelt_status sc_compile_specs(ScSpecGraph *specs, int n, const ScCompileOptions *o,
                              const char *out_path) SMELT_MUST_USE;
smelt_status sc_compile_specs_to_memory(ScSpecGraph *specs, int n, const ScCompileOptions *o, void **out_buf,
                                        size_t *out_len) SMELT_MUST_USE;

/* Compiles g in memory and opens the result: what `smelt run MODEL.yaml
 * --device cpu|cuda` needs (the bundle is named after o->model in messages). */
smelt_status sc_bundle_from_graph(Graph *g, const ScCompileOptions *o, smelt_bundle **out_bundle) SMELT_MUST_USE;

/* smelt_compile without the file: YAML → passes → bundle bytes (free()).
 * options->targets may name cuda; the arch is then sc_cuda_default_arch(). */
smelt_status sc_compile_model_to_memory(const char *model_path, const smelt_compile_options *options,
                                        void **out_buf, size_t *out_len) SMELT_MUST_USE;


/* The LLVM IR of kernel i (its functions, before optimisation), generated
 * again from the bundle's graph and kernel table; malloc'd (free()). */
smelt_status sc_bundle_kernel_llvm_ir(const smelt_bundle *b, int i, char **out_text) SMELT_MUST_USE;

#endif
