/* What the runtime's files share: an opened bundle (runtime/loader.c) and
 * a session (runtime/session.c on the CPU and for every device,
 * runtime/cuda_session.c for what a CUDA session owns).  Not installed. */
#ifndef SMELT_RT_INTERNAL_H
#define SMELT_RT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/cuda_launch.h"
#include "format/weights.h"
#include "format/kernel_table.h"
#include "include/smelt.h"
#include "runtime/cuda_driver.h"
#include "runtime/elf_loader.h"
#include "runtime/runtime.h"
#include "runtime/threadpool.h"

typedef void (*RtKernelFn)(void *const *args, int64_t task_begin, int64_t task_end);

typedef struct {
  char *key, *value;
} ManifestEntry;

/* An opened bundle is its first specialisation; the others are bundles
 * of their own (specs[1..]) that share the root's file and manifest, so
 * that everything that works on one specialisation (sessions, check.c,
 * inspect) takes a smelt_bundle either way. */
struct smelt_bundle {
  FmtFile *file;      /* owned by the root */
  smelt_bundle *root;  /* itself for the bundle smelt_bundle_open returns */
  char prefix[16];     /* of its sections' names: "" in a bundle of one, else "sI/" */
  char *label;         /* "seq=16"; "" in a bundle of one (malloc'd) */
  char *signature;     /* fmt_input_signature of g (malloc'd) */
  smelt_bundle **specs; /* the root's: every specialisation, specs[0] == root */
  int nspecs;
  Graph *g;
  Kernel *kernels;
  int nkernels;
  ManifestEntry *manifest;
  int nmanifest;
  RtElfImage *code_image; /* the loaded CPU object; NULL when opened without machine code */
  char *cpu_variant;   /* the CPU variant loaded ("x86-64-v3"; malloc'd) */
  RtKernelFn *fns;     /* per kernel */
  char *no_cpu;        /* why CPU sessions cannot run it (malloc'd); NULL when they can */
  FmtCudaModule *cuda;  /* the CUDA launch table with the units' sources; NULL: no CUDA code */
  bool code;           /* opened with its code (not rt_bundle_open_nojit) */
  /* The root's, shared by every specialisation: the graphs' constants point
   * into the constants section (the mapped file) and into weights. */
  FmtWeights *weights_table; /* the weights section, decoded; NULL: no external weights */
  FmtWeightsSet *weights;    /* its files, mapped and checked, tensors assembled */
  const void *consts;        /* the constants section; NULL when there is none */
  size_t consts_len;
  /* Tensor parallelism (manifest "tp"): the bundle smelt_bundle_open
   * returns is rank 0; ranks[r] (ranks[0] == itself) is rank r's part,
   * under the section prefix "rR/", a root of its own specialisations
   * whose file, manifest, constants and weights are borrowed from the
   * bundle that `owner` names (NULL for that bundle itself). */
  smelt_bundle **ranks;
  int nranks;                /* 1 without --tp */
  int rank;
  smelt_bundle *owner;
};

/* What a CUDA session owns.  Device addresses are 0 when unset. */
typedef struct {
  RtCudaDevice *dev;
  RtCudaModule **mods;     /* per unit */
  RtCudaLoadKind *loaded;  /* per unit: how it was loaded */
  RtCudaFunction *fns;     /* per kernel */
  RtCudaPtr const_block;   /* every constant (rt_cuda_upload_constants) */
  RtCudaPtr *const_ptr;    /* per value: its constant's address */
  RtCudaPtr arena;
  RtCudaPtr *own;          /* per value: a buffer of its own (off-plan intermediate, staging) */
  RtCudaPtr *dptr;         /* per value: its device address in this run */
  bool *staged;            /* per value: an input/output copied through own[v] (always, with a ranged
                            * axis: own[v] is laid out at the max, as the kernels were compiled) */
  RtCudaPtr *argval;       /* every kernel's argument values, back to back (argv_at) */
  RtCudaPtr *captured;     /* argval as the graph was captured with */
  void **params;           /* per kernel, back to back: &argval[..] of its arguments, then &rng with
                            * ranged dims, &ws when it has a workspace, then its TMA descriptors
                            * (cuLaunchKernel's kernelParams) */
  RtCudaPtr ws;            /* the workspace every kernel that needs one shares (zeroed once) */
  RtCudaPtr rng;           /* ranged dims: the run's value of each range (RtRun.ranges), on the device */
  unsigned char *tmaps;    /* every kernel's TMA descriptors, 128 bytes each, 64-byte aligned */
  RtCudaPtr *tmap_base;    /* per descriptor: the address it was encoded for (0: not yet) */
  int *tmap_at;            /* per kernel: its first descriptor in tmaps */
  RtCudaLaunch *launches;  /* per kernel */
  RtCudaGraph *graph;      /* NULL: capture on the next run */
  void **mirror;           /* per value: host copy for rt_session_read_value */
  /* Tensor parallelism: per collective kernel, what its launch's enqueue
   * needs (the session, the kernel, an all_gather's staging buffer), and
   * the ranged dims' values the graph was captured with (a collective's
   * size follows them: runtime/cuda_session.c). */
  struct RtCudaColl *colls;
  bool has_colls;
  int64_t captured_ranges[IR_MAX_RANGES];
} CudaState;

/* What a session keeps for one specialisation it has run: the memory and
 * argument arrays of that graph's runs. */
typedef struct {
  void *arena;
  void **own;          /* per value: its own buffer, or NULL */
  void **vptr;         /* per value: where it lives during a run */
  void **argv;         /* every kernel's argument pointers, back to back */
  int *argv_at;        /* per kernel: its first entry in argv (on the CPU nargs + 1 each: then the ranges) */
  CudaState *cu;       /* NULL on the CPU */
  /* Ranged dims (ir.h): each range's value in this run (its max until a
   * run sets it); inputs and outputs with a ranged axis are copied through
   * own[v], laid out at the max. */
  int64_t ranges[IR_MAX_RANGES];
} RtRun;

/* What was bound to one input or output slot. */
typedef struct {
  size_t bytes;
  bool bound;
  bool shaped;         /* bound with its shape (inputs only) */
  TensorType shape;    /* its shape, when shaped (dtype: the slot's) */
} Binding;

struct smelt_session {
  smelt_bundle *root;
  /* Tensor parallelism: a session on a bundle of several ranks is rank 0's
   * and drives the others (peers[r - 1] is rank r's session) on the
   * crew's threads; comm is shared by all of them (runtime/comm.h). */
  int rank, nranks;
  struct smelt_session **peers;
  struct RtComm *comm;
  struct RtCrew *crew;
  void **scratch;      /* a peer's outputs, per output slot (the caller reads rank 0's) */
  size_t *scratch_bytes;
  /* CUDA ranks: NCCL's communicators (runtime/nccl.h), rank 0's, shared by
   * the peers; NULL when the ranks share a GPU and their collectives go
   * through host memory instead (comm, as on the CPU; for tests).  A
   * peer's outputs live in device buffers of its own (dev_scratch, per
   * output slot, on rank 0 per peer: (r - 1) * noutputs + slot). */
  struct RtNccl *nccl;
  smelt_cuda_buffer **dev_scratch;
  smelt_bundle *b;     /* the active specialisation; the root before one is chosen */
  RtRun *r;            /* its run state; NULL before one is chosen */
  RtRun *runs;         /* per specialisation, made when it is first chosen */
  bool *made;          /* per specialisation: runs[i] is made */
  int active, pinned;  /* specialisations; -1: none */
  bool cuda;
  int ordinal;
  RtCudaDevice *dev;   /* CUDA sessions: the device, shared by every run */
  RtPool *pool;        /* CPU sessions: the threads, shared by every run */
  /* State tensors (ir.h: Graph.states), owned by the session and shared by
   * every specialisation (the same states, in the same order, in each):
   * zeroed at creation, kept across runs. */
  int nstates;
  size_t *state_bytes;
  void **state;        /* CPU sessions: per state, its memory */
  RtCudaPtr *state_dev; /* CUDA sessions: per state, its device memory */
  /* CUDA sessions: constants on the device, shared by every specialisation
   * (their graphs' constants point at the same host bytes, the bundle's
   * constants section or its weights): one upload per distinct tensor. */
  struct RtCudaConst *consts;
  int nconsts, cap_consts;
  RtCudaPtr *const_blocks; /* allocations the entries point into */
  int nblocks;
  const void **in_ptr; /* per graph input slot: bound memory */
  void **out_ptr;      /* per graph output slot: bound memory */
  Binding *in_bind, *out_bind;
};

/* ---- shared helpers ---- */

/* Verifies the constants section's checksum, which opening defers (it is
 * most of a bundle, and most of the cost of opening one); once per bundle,
 * thread-safe.  Sessions call it before they read a constant. */
smelt_status rt_bundle_check_constants(const smelt_bundle *b) SMELT_MUST_USE;

/* A zeroed buffer of at least `bytes`, 64-byte aligned (free()). */
void *rt_aligned_buffer(size_t bytes);
bool rt_is_graph_output(const Graph *g, int v);

/* ---- one rank's session (runtime/session.c) ---- */

/* A session on bundle b alone (b a root: a plain bundle, or one rank's
 * part), with a pool of `threads`. */
smelt_status rt_session_create_one(smelt_bundle *b, bool cuda, int ordinal, int threads,
                                   const smelt_session_options *options, smelt_session **out_session) SMELT_MUST_USE;
/* rt_session_prepare, _run_kernel, _finish and smelt_session_run of this
 * session alone (the public ones drive every rank of a tensor-parallel
 * session). */
smelt_status rt_session_prepare_one(smelt_session *s) SMELT_MUST_USE;
smelt_status rt_session_run_kernel_one(smelt_session *s, int i) SMELT_MUST_USE;
smelt_status rt_session_finish_one(smelt_session *s) SMELT_MUST_USE;
smelt_status rt_session_run_one(smelt_session *s) SMELT_MUST_USE;

/* ---- tensor-parallel sessions (runtime/ranks.c) ---- */

#define RT_MAX_RANKS 64 /* as the loader takes (manifest tp=N) */

/* Rank 0's session on b (a bundle of b->nranks ranks) with a session per
 * other rank, `threads` split between them, their communicator and the
 * threads that run them; on CUDA, rank r on device ordinals[r], and NCCL's
 * communicators when the ordinals differ. */
smelt_status rt_ranks_session_create(smelt_bundle *b, int threads, const smelt_session_options *options, bool cuda,
                                     const int *ordinals, smelt_session **out_session) SMELT_MUST_USE;
/* Frees what a tensor-parallel session adds (nothing for another). */
void rt_ranks_session_free(smelt_session *s);
/* The binding just made on rank 0's session, made on every other rank:
 * the same input memory (read in place), an output buffer of their own. */
smelt_status rt_ranks_bind(smelt_session *s, bool input, const char *name, const void *data, const Binding *bd)
    SMELT_MUST_USE;
typedef enum {
  RT_STEP_RUN, RT_STEP_PREPARE, RT_STEP_KERNEL, RT_STEP_FINISH,
  /* CUDA ranks: smelt_session_enqueue and _synchronize, and the timings of
   * smelt bench (rt_session_cuda_time_kernels / _graph) */
  RT_STEP_ENQUEUE, RT_STEP_SYNC, RT_STEP_TIME_KERNELS, RT_STEP_TIME_GRAPH
} RtStep;
/* The step on every rank at once (the kernel index for RT_STEP_KERNEL). */
smelt_status rt_ranks_step(smelt_session *s, RtStep what, int kernel) SMELT_MUST_USE;
/* A timing step: iters (and the graph's batch) on every rank, rank 0's
 * times into out (as rt_session_cuda_time_kernels / _graph). */
smelt_status rt_ranks_time(smelt_session *s, RtStep what, int iters, int batch, double *out) SMELT_MUST_USE;
/* The axis along which state i (of Graph.states) is split over the ranks
 * (the manifest's tp_states, from the shard pass), or -1: whole on every
 * rank, or not a tensor-parallel session. */
int rt_ranks_state_axis(const smelt_session *s, int i);
/* State i of every rank to or from data, the whole state (the ranks' parts
 * concatenated along its axis), bytes the whole's size. */
smelt_status rt_ranks_state_copy(smelt_session *s, int i, void *data, bool read) SMELT_MUST_USE;
/* An all_gather kernel's input as `outer` rows of `block` bytes, each row
 * this rank's part of the gathered axis and all after it (a concatenation
 * puts block o of rank r at (o * nranks + r) * block). */
void rt_all_gather_blocks(const Graph *g, const Kernel *kn, size_t *outer, size_t *block);
/* Kernel i of this rank's session, a collective, with the other ranks. */
smelt_status rt_ranks_collective(smelt_session *s, int i) SMELT_MUST_USE;

/* ---- CUDA sessions (runtime/cuda_session.c) ---- */

/* A tensor of type t with a ranged axis (ir.h) at the run's range values
 * rv: `count` blocks of `run` bytes, `full` bytes apart laid out at the
 * max, `run` bytes apart packed (the rows of the ranged axis are the
 * leading ones of each block). */
void rt_ranged_blocks(const TensorType *t, const int64_t *rv, size_t *count, size_t *run, size_t *full);

/* Creates the CUDA state of the session's active run: modules, constants,
 * device memory, argument arrays; nargs is the total argument count. */
typedef struct RtCudaConst {
  const void *host;
  size_t bytes;
  RtCudaPtr dev;
} RtCudaConst;

smelt_status rt_cuda_session_create(smelt_session *s, size_t nargs) SMELT_MUST_USE;
/* Frees the session's shared device constants (smelt_session_destroy). */
void rt_cuda_session_free_constants(smelt_session *s);
/* Frees it (nothing when the run is on the CPU). */
void rt_cuda_session_destroy(smelt_session *s);
/* Binds inputs and outputs to device addresses, copies staged inputs in
 * and encodes TMA descriptors. */
smelt_status rt_cuda_session_prepare(smelt_session *s) SMELT_MUST_USE;
/* Copies staged outputs back and waits. */
smelt_status rt_cuda_session_finish(smelt_session *s) SMELT_MUST_USE;
/* One run as a CUDA graph (captured on the first run). */
smelt_status rt_cuda_session_run(smelt_session *s) SMELT_MUST_USE;
smelt_status rt_cuda_session_enqueue(smelt_session *s) SMELT_MUST_USE;
/* smelt_session_enqueue's rule: every output bound to device memory. */
smelt_status rt_cuda_check_enqueue_outputs(const smelt_session *s) SMELT_MUST_USE;
/* One rank's part of rt_session_cuda_time_kernels / _graph. */
smelt_status rt_cuda_session_time_kernels(smelt_session *s, int iters, double *out_ms) SMELT_MUST_USE;
smelt_status rt_cuda_session_time_graph(smelt_session *s, int reps, int batch, double *out_ms) SMELT_MUST_USE;
/* Destroys every captured graph of the session (before its NCCL
 * communicators go: the graphs hold their collectives). */
void rt_cuda_session_drop_graphs(smelt_session *s);
smelt_status rt_cuda_session_synchronize(smelt_session *s) SMELT_MUST_USE;

#endif
