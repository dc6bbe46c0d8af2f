/* The LLVM compile driver: Kernels to one ELF object.
 *
 * One LLVM context and module per call (nothing is shared between calls, so
 * compiles on different threads do not interfere; target registration is
 * process-wide but idempotent, done once through pthread_once).  For every
 * kernel it builds two functions:
 *   NAME.body(i8* noalias a0, ..., i8* noalias aN, i64 begin, i64 end)
 *       (noalias except on arguments that plan-memory placed in place over
 *       each other: see shares_memory)
 *       internal, always inlined: the loop nest, where each buffer is its
 *       own noalias parameter so LLVM knows stores to one output cannot
 *       change an input and vectorises without run-time overlap checks;
 *   NAME(i8** args, i64 begin, i64 end)
 *       the exported ABI of kernel.h: loads the pointers and calls the body
 *       (the inliner turns the noalias parameters into scoped alias
 *       metadata, so the facts survive inlining);
 * and, for a kernel whose GEMM reads a packed weight (gemm.c), a third:
 *   NAME__prepack(i8** args)
 *       fills the packed weight's zero-initialised global from the weight
 *       constant, once, when the bundle is opened (cg_llvm.h).
 * Which loop nest the body holds depends on the group's anchor: none
 * (elementwise), a reduction or norm, a matmul or conv2d, attention, or a
 * pooling window.
 *
 * Then: verify (the verifier's message goes into the status), optimise with
 * the new pass manager ("default<O3>", loop and SLP vectorisation on) for
 * the target machine of the host CPU (or the one asked for), and emit an
 * object file into memory.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <llvm-c/Analysis.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>

#include "codegen/llvm/cg_internal.h"

#ifndef SMELT_LLVM_VERSION
#define SMELT_LLVM_VERSION "?"
#endif

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int init_failed; /* written once inside pthread_once, read after it */

static void init_llvm(void) {
  init_failed = LLVMInitializeNativeTarget() || LLVMInitializeNativeAsmPrinter();
}

smelt_status cg_llvm_init(void) {
  pthread_once(&init_once, init_llvm);
  if (init_failed) return st_error(ST_UNSUPPORTED, "LLVM has no code generator for this machine");
  return NULL;
}

/* ---- target ---- */

typedef struct {
  LLVMTargetMachineRef tm;
  char *triple, *cpu, *features;
} Target;

static void target_free(Target *t) {
  if (t->tm) LLVMDisposeTargetMachine(t->tm);
  LLVMDisposeMessage(t->triple);
  LLVMDisposeMessage(t->cpu);
  LLVMDisposeMessage(t->features);
  memset(t, 0, sizeof *t);
}

static smelt_status target_create(const CgLlvmOptions *opt, Target *t) {
  memset(t, 0, sizeof *t);
  RETURN_IF_ERROR(cg_llvm_init());
  t->triple = LLVMGetDefaultTargetTriple();
  t->cpu = opt && opt->cpu ? LLVMCreateMessage(opt->cpu) : LLVMGetHostCPUName();
  t->features = opt && opt->features ? LLVMCreateMessage(opt->features)
                : opt && opt->cpu    ? LLVMCreateMessage("")
                                     : LLVMGetHostCPUFeatures();
  LLVMTargetRef target;
  char *msg = NULL;
  if (LLVMGetTargetFromTriple(t->triple, &target, &msg)) {
    smelt_status st = st_error(ST_UNSUPPORTED, "LLVM target %s: %s", t->triple, msg ? msg : "unknown");
    LLVMDisposeMessage(msg);
    target_free(t);
    return st;
  }
  t->tm = LLVMCreateTargetMachine(target, t->triple, t->cpu, t->features, LLVMCodeGenLevelAggressive, LLVMRelocPIC,
                                  LLVMCodeModelDefault);
  if (!t->tm) {
    smelt_status st = st_error(ST_UNSUPPORTED, "LLVM cannot build code for %s cpu %s", t->triple, t->cpu);
    target_free(t);
    return st;
  }
  return NULL;
}

smelt_status cg_llvm_host_target(char **out_cpu, char **out_features) {
  *out_cpu = *out_features = NULL;
  RETURN_IF_ERROR(cg_llvm_init());
  char *cpu = LLVMGetHostCPUName(), *feats = LLVMGetHostCPUFeatures();
  *out_cpu = strdup(cpu ? cpu : "generic");
  *out_features = strdup(feats ? feats : "");
  LLVMDisposeMessage(cpu);
  LLVMDisposeMessage(feats);
  if (!*out_cpu || !*out_features) {
    free(*out_cpu), free(*out_features);
    *out_cpu = *out_features = NULL;
    return st_error(ST_NO_MEMORY, "out of memory");
  }
  return NULL;
}

/* f16 <-> f32 in hardware: x86 with F16C, and every AArch64. */
static bool target_has_f16(const Target *t) {
  if (strncmp(t->triple, "aarch64", 7) == 0 || strncmp(t->triple, "arm64", 5) == 0) return true;
  return strstr(t->features, "+f16c") != NULL;
}

/* ---- one kernel ---- */

static void add_attr(CgMod *m, LLVMValueRef fn, LLVMAttributeIndex idx, const char *name) {
  unsigned kind = LLVMGetEnumAttributeKindForName(name, strlen(name));
  LLVMAddAttributeAtIndex(fn, idx, LLVMCreateEnumAttribute(m->ctx, kind, 0));
}

/* LLVM tunes Intel's AVX-512 CPUs (skylake-avx512, icelake, sapphirerapids)
 * to prefer 256-bit vectors: the vectoriser picks 8 lanes and the backend
 * splits the GEMM's explicit 16-lane vectors into two 256-bit halves unless
 * a function says it needs 512-bit ones, as clang marks code that uses
 * 512-bit intrinsics.  On an Emerald Rapids core the BERT-base GEMMs ran at
 * 76 GFLOP/s on 2 threads that way (OpenBLAS: 188). */
static void wide_vectors(CgMod *m, LLVMValueRef fn) {
  if (!m->avx512) return;
  static const char *const kv[][2] = {{"prefer-vector-width", "512"}, {"min-legal-vector-width", "512"}};
  for (size_t i = 0; i < sizeof kv / sizeof *kv; i++)
    LLVMAddAttributeAtIndex(fn, LLVMAttributeFunctionIndex,
                            LLVMCreateStringAttribute(m->ctx, kv[i][0], (unsigned)strlen(kv[i][0]), kv[i][1],
                                                      (unsigned)strlen(kv[i][1])));
}

/* Which stored results depend on the anchor (the epilogue) and which do
 * not (side results: stored by their own loop nests). */
static smelt_status classify(CgFn *f) {
  Graph *g = f->g;
  const Group *gr = f->grp;
  for (int i = 0; i < gr->nnodes; i++) {
    const Node *n = &g->node[gr->nodes[i]];
    for (int j = 0; j < n->nin && f->anchor >= 0; j++) {
      const Value *v = &g->val[n->in[j]];
      if (v->kind == VK_NODE && f->member[v->node] && (v->node == f->anchor || f->dep[v->node]))
        f->dep[gr->nodes[i]] = true;
    }
  }
  for (int i = f->nin; i < f->k->nargs; i++) {
    int v = f->k->args[i];
    const Value *val = &g->val[v];
    if (val->kind != VK_NODE || !f->member[val->node])
      return st_error(ST_INTERNAL, "kernel %s: output '%s' is not computed by its group", f->k->name, val->name);
    bool epi = f->anchor >= 0 && (val->node == f->anchor || f->dep[val->node]);
    if (!epi) {
      f->side[f->nside++] = v;
      continue;
    }
    const TensorType *at = cg_anchor_type(f);
    if (val->type.rank != at->rank || memcmp(at->dim, val->type.dim, sizeof(int64_t) * (size_t)at->rank) != 0)
      return st_error(ST_UNSUPPORTED,
                      "kernel %s: result '%s' follows the anchor '%s' but has another shape; only elementwise "
                      "consumers of the anchor's result can share its kernel",
                      f->k->name, val->name, ir_node_name(g, &g->node[f->anchor]));
    f->epi[f->nepi++] = v;
  }
  return NULL;
}

static smelt_status emit_body(CgFn *f) {
  if (f->anchor < 0) return cg_llvm_emit_elemwise(f);
  const Node *a = &f->g->node[f->anchor];
  bool red[IR_MAX_RANK];
  if (cg_reduced_axes(f->g, a, red)) return cg_llvm_emit_reduction(f);
  switch (a->op) {
  case OP_MATMUL: case OP_CONV2D: return cg_llvm_emit_contraction(f);
  case OP_ATTENTION: return cg_llvm_emit_attention(f);
  case OP_MAX_POOL2D: case OP_AVG_POOL2D: return cg_llvm_emit_pool(f);
  case OP_SCATTER: return cg_llvm_emit_scatter(f);
  case OP_ARGMAX: return cg_llvm_emit_argmax(f);
  case OP_TOPK: return cg_llvm_emit_topk(f);
  case OP_ARANGE: return cg_llvm_emit_arange(f);
  default:
    return st_error(ST_UNSUPPORTED, "kernel %s: no CPU kernel for an anchor '%s' (%s)", f->k->name,
                    ir_node_name(f->g, a), ir_op_name(a->op));
  }
}

/* plan-memory may let an elementwise kernel write its result over an input
 * that dies there (in place).  Such arguments overlap in the arena, so they
 * must not be marked noalias; the kernel reads every element before it
 * writes the same element, so the code is still right without it.
 * A state and the result of the scatter that updates it in place are the
 * same memory too (the session's state, outside the arena: mem_offset -1;
 * runtime/session.c place_states). */
static bool shares_memory(const Graph *g, const Kernel *k, int i) {
  int sa = ir_state_of(g, k->args[i]);
  if (sa >= 0) {
    for (int j = 0; j < k->nargs; j++)
      if (j != i && ir_state_of(g, k->args[j]) == sa) return true;
    return false;
  }
  const Value *a = &g->val[k->args[i]];
  if (a->mem_offset < 0) return false;
  int64_t a0 = a->mem_offset, a1 = a0 + (int64_t)ir_type_bytes(&a->type);
  for (int j = 0; j < k->nargs; j++) {
    const Value *b = &g->val[k->args[j]];
    if (j == i || b->mem_offset < 0) continue;
    int64_t b0 = b->mem_offset, b1 = b0 + (int64_t)ir_type_bytes(&b->type);
    if (a0 < b1 && b0 < a1) return true;
  }
  return false;
}

static smelt_status build_kernel(CgMod *m, const Kernel *k) {
  Graph *g = m->g;
  if (k->group < 0 || k->group >= g->ngroups) return st_error(ST_INTERNAL, "kernel %s: no group %d", k->name, k->group);
  const Group *gr = &g->groups[k->group];
  /* LLVM would quietly rename a second function of the same name, and the
   * runtime would then look up the wrong kernel */
  if (LLVMGetNamedFunction(m->mod, k->name))
    return st_error(ST_INTERNAL, "two kernels are named %s", k->name);
  int count;
  int anchor = cg_group_anchor(g, gr, &count);
  if (count > 1)
    return st_error(ST_UNSUPPORTED, "kernel %s: %d reduction/contraction/opaque nodes in one group", k->name, count);

  /* NAME.body: one pointer per argument, then the task range */
  int na = k->nargs;
  LLVMTypeRef *pt = malloc(sizeof(LLVMTypeRef) * (size_t)(na + 3));
  CgFn *f = calloc(1, sizeof *f);
  int *arg_of = malloc(sizeof(int) * (size_t)(g->nval ? g->nval : 1));
  bool *member = calloc((size_t)(g->nnode ? g->nnode : 1), sizeof(bool));
  bool *dep = calloc((size_t)(g->nnode ? g->nnode : 1), sizeof(bool));
  int *lists = malloc(sizeof(int) * (size_t)(2 * (k->nouts ? k->nouts : 1)));
  LLVMValueRef *base = malloc(sizeof(LLVMValueRef) * (size_t)(na ? na : 1));
  smelt_status st = NULL;
  if (!pt || !f || !arg_of || !member || !dep || !lists || !base) {
    st = st_error(ST_NO_MEMORY, "out of memory compiling kernel %s", k->name);
    goto done;
  }
  for (int i = 0; i < na; i++) pt[i] = m->t_ptr;
  pt[na] = pt[na + 1] = m->t_i64;
  pt[na + 2] = m->t_ptr; /* the run's values of the ranged dims (format/kernel.h) */
  LLVMTypeRef body_ty = LLVMFunctionType(m->t_void, pt, (unsigned)na + 3, 0);
  char name[128];
  snprintf(name, sizeof name, "%s.body", k->name);
  LLVMValueRef body = LLVMAddFunction(m->mod, name, body_ty);
  wide_vectors(m, body);
  LLVMSetLinkage(body, LLVMInternalLinkage);
  add_attr(m, body, LLVMAttributeFunctionIndex, "alwaysinline");
  add_attr(m, body, LLVMAttributeFunctionIndex, "nounwind");
  int nin = k->nargs - k->nouts;
  for (int i = 0; i < na; i++) {
    if (!shares_memory(g, k, i)) add_attr(m, body, (LLVMAttributeIndex)(i + 1), "noalias");
    else f->in_place = true;
    add_attr(m, body, (LLVMAttributeIndex)(i + 1), "nocapture");
    if (i < nin) add_attr(m, body, (LLVMAttributeIndex)(i + 1), "readonly");
  }

  f->m = m;
  f->b = m->b;
  f->g = g;
  f->k = k;
  f->grp = gr;
  f->fn = body;
  f->anchor = anchor;
  f->nin = nin;
  f->arg_of = arg_of;
  f->member = member;
  f->dep = dep;
  f->base = base;
  f->epi = lists;
  f->side = lists + k->nouts;
  f->ov_value = -1;
  for (int v = 0; v < g->nval; v++) arg_of[v] = -1;
  for (int i = 0; i < nin; i++) arg_of[k->args[i]] = i;
  for (int i = 0; i < gr->nnodes; i++) member[gr->nodes[i]] = true;
  st = classify(f);
  if (st) goto done;

  f->entry = LLVMAppendBasicBlockInContext(m->ctx, body, "entry");
  LLVMBasicBlockRef start = LLVMAppendBasicBlockInContext(m->ctx, body, "start");
  f->ab = LLVMCreateBuilderInContext(m->ctx);
  LLVMPositionBuilderAtEnd(f->ab, f->entry);
  for (int i = 0; i < na; i++) {
    LLVMTypeRef et = cg_stype(m, g->val[k->args[i]].type.dt);
    base[i] = LLVMBuildBitCast(f->ab, LLVMGetParam(body, (unsigned)i), LLVMPointerType(et, 0), "");
  }
  f->task_begin = LLVMGetParam(body, (unsigned)na);
  f->task_end = LLVMGetParam(body, (unsigned)na + 1);
  f->ranges = LLVMBuildBitCast(f->ab, LLVMGetParam(body, (unsigned)na + 2), LLVMPointerType(m->t_i64, 0), "ranges");
  LLVMPositionBuilderAtEnd(m->b, start);
  st = emit_body(f);
  if (!st && m->err) {
    st = m->err;
    m->err = NULL;
  }
  if (st) {
    LLVMDisposeBuilder(f->ab);
    goto done;
  }
  LLVMBuildRetVoid(m->b);
  LLVMBuildBr(f->ab, start);
  LLVMDisposeBuilder(f->ab);

  /* NAME(void *const *args, int64_t begin, int64_t end) */
  LLVMTypeRef api_params[3] = {LLVMPointerType(m->t_ptr, 0), m->t_i64, m->t_i64};
  LLVMTypeRef api_ty = LLVMFunctionType(m->t_void, api_params, 3, 0);
  LLVMValueRef api = LLVMAddFunction(m->mod, k->name, api_ty);
  wide_vectors(m, api);
  add_attr(m, api, LLVMAttributeFunctionIndex, "nounwind");
  LLVMPositionBuilderAtEnd(m->b, LLVMAppendBasicBlockInContext(m->ctx, api, "entry"));
  LLVMValueRef *cargs = malloc(sizeof(LLVMValueRef) * (size_t)(na + 3));
  if (!cargs) {
    st = st_error(ST_NO_MEMORY, "out of memory compiling kernel %s", k->name);
    goto done;
  }
  for (int i = 0; i < na; i++) {
    LLVMValueRef idx = cg_i64(m, i);
    LLVMValueRef p = LLVMBuildInBoundsGEP2(m->b, m->t_ptr, LLVMGetParam(api, 0), &idx, 1, "");
    cargs[i] = LLVMBuildLoad2(m->b, m->t_ptr, p, "");
  }
  cargs[na] = LLVMGetParam(api, 1);
  cargs[na + 1] = LLVMGetParam(api, 2);
  cargs[na + 2] = LLVMConstNull(m->t_ptr);
  if (g->nranges) {
    LLVMValueRef idx = cg_i64(m, na);
    cargs[na + 2] = LLVMBuildLoad2(m->b, m->t_ptr, LLVMBuildInBoundsGEP2(m->b, m->t_ptr, LLVMGetParam(api, 0), &idx, 1, ""), "");
  }
  LLVMBuildCall2(m->b, body_ty, body, cargs, (unsigned)na + 3, "");
  LLVMBuildRetVoid(m->b);
  free(cargs);
done:
  free(pt), free(f), free(arg_of), free(member), free(dep), free(lists), free(base);
  return st;
}

/* ---- the module ---- */

/* LLVM reports through the context: errors become the module's status;
 * warnings and remarks (a loop the vectoriser was asked to but could not
 * vectorise) are dropped, since library code does not print. */
static void on_diagnostic(LLVMDiagnosticInfoRef di, void *user) {
  CgMod *m = user;
  if (LLVMGetDiagInfoSeverity(di) != LLVMDSError) return;
  char *msg = LLVMGetDiagInfoDescription(di);
  cg_fail(m, ST_INTERNAL, "LLVM: %s", msg ? msg : "error");
  LLVMDisposeMessage(msg);
}

static void mod_init(CgMod *m, Graph *g, const Target *t, const CgLlvmOptions *opt) {
  memset(m, 0, sizeof *m);
  m->g = g;
  m->ctx = LLVMContextCreate();
  LLVMContextSetDiagnosticHandler(m->ctx, on_diagnostic, m);
  m->mod = LLVMModuleCreateWithNameInContext(g->name ? g->name : "smelt", m->ctx);
  m->b = LLVMCreateBuilderInContext(m->ctx);
  m->t_void = LLVMVoidTypeInContext(m->ctx);
  m->t_i1 = LLVMInt1TypeInContext(m->ctx);
  m->t_i8 = LLVMInt8TypeInContext(m->ctx);
  m->t_i16 = LLVMInt16TypeInContext(m->ctx);
  m->t_i32 = LLVMInt32TypeInContext(m->ctx);
  m->t_i64 = LLVMInt64TypeInContext(m->ctx);
  m->t_f16 = LLVMHalfTypeInContext(m->ctx);
  m->t_f32 = LLVMFloatTypeInContext(m->ctx);
  m->t_f64 = LLVMDoubleTypeInContext(m->ctx);
  m->t_ptr = LLVMPointerType(m->t_i8, 0);
  m->native_f16 = !(opt && opt->soft_f16) && target_has_f16(t);
  m->avx512 = strstr(t->features, "+avx512f") != NULL;
  m->f32_lanes = m->avx512 ? 16 : strstr(t->features, "+avx") ? 8 : 4;
  m->pack_at_compile = opt && opt->pack_at_compile;
  m->md_loop = LLVMGetMDKindIDInContext(m->ctx, "llvm.loop", 9);
  m->md_parallel = LLVMGetMDKindIDInContext(m->ctx, "llvm.mem.parallel_loop_access", 29);
  LLVMSetTarget(m->mod, t->triple);
  LLVMTargetDataRef td = LLVMCreateTargetDataLayout(t->tm);
  char *dl = LLVMCopyStringRepOfTargetData(td);
  LLVMSetDataLayout(m->mod, dl);
  LLVMDisposeMessage(dl);
  LLVMDisposeTargetData(td);
}

static void mod_free(CgMod *m) {
  if (m->b) LLVMDisposeBuilder(m->b);
  if (m->mod) LLVMDisposeModule(m->mod);
  if (m->ctx) LLVMContextDispose(m->ctx);
  st_free(m->err);
  memset(m, 0, sizeof *m);
}

/* Builds and verifies the module of kernels k[0..nk), optimised unless
 * `optimise` is false. */
static smelt_status build_module(CgMod *m, const Target *t, const CgLlvmOptions *opt, Graph *g, Kernel *k, int nk,
                                 bool optimise) {
  mod_init(m, g, t, opt);
  for (int i = 0; i < nk; i++)
    if (!fmt_kernel_collective(g, &k[i])) RETURN_IF_ERROR(build_kernel(m, &k[i])); /* the runtime runs those */
  char *msg = NULL;
  if (LLVMVerifyModule(m->mod, LLVMReturnStatusAction, &msg)) {
    smelt_status st = st_error(ST_INTERNAL, "LLVM verifier rejected the generated kernels: %s", msg ? msg : "");
    LLVMDisposeMessage(msg);
    return st;
  }
  LLVMDisposeMessage(msg);
  if (!optimise || (opt && opt->no_opt)) return NULL;
  LLVMPassBuilderOptionsRef po = LLVMCreatePassBuilderOptions();
  LLVMPassBuilderOptionsSetLoopVectorization(po, 1);
  LLVMPassBuilderOptionsSetSLPVectorization(po, 1);
  LLVMPassBuilderOptionsSetLoopInterleaving(po, 1);
  LLVMPassBuilderOptionsSetLoopUnrolling(po, 1);
  LLVMErrorRef err = LLVMRunPasses(m->mod, "default<O3>", t->tm, po);
  LLVMDisposePassBuilderOptions(po);
  if (!err && m->err) {
    smelt_status st = m->err;
    m->err = NULL;
    return st;
  }
  if (err) {
    char *em = LLVMGetErrorMessage(err);
    smelt_status st = st_error(ST_INTERNAL, "LLVM optimiser: %s", em);
    LLVMDisposeErrorMessage(em);
    return st;
  }
  return NULL;
}

smelt_status cg_llvm_compile(Graph *g, Kernel *k, int nk, const CgLlvmOptions *opt, void **out_obj, size_t *out_len,
                             char **out_desc) {
  *out_obj = NULL;
  *out_len = 0;
  if (out_desc) *out_desc = NULL;
  Target t;
  RETURN_IF_ERROR(target_create(opt, &t));
  CgMod m;
  smelt_status st = build_module(&m, &t, opt, g, k, nk, true);
  LLVMMemoryBufferRef buf = NULL;
  char *msg = NULL;
  if (!st && LLVMTargetMachineEmitToMemoryBuffer(t.tm, m.mod, LLVMObjectFile, &msg, &buf)) {
    st = st_error(ST_INTERNAL, "LLVM code generation: %s", msg ? msg : "");
    buf = NULL;
  }
  LLVMDisposeMessage(msg);
  if (!st && m.err) { /* reported through the diagnostic handler */
    st = m.err;
    m.err = NULL;
  }
  if (!st) {
    size_t len = LLVMGetBufferSize(buf);
    void *obj = malloc(len ? len : 1);
    int dn = snprintf(NULL, 0, "LLVM %s %s cpu=%s features=%s", SMELT_LLVM_VERSION, t.triple, t.cpu, t.features);
    char *desc = out_desc ? malloc((size_t)dn + 1) : NULL;
    if (!obj || (out_desc && !desc)) {
      free(obj), free(desc);
      st = st_error(ST_NO_MEMORY, "out of memory copying the object code");
    } else {
      memcpy(obj, LLVMGetBufferStart(buf), len);
      *out_obj = obj;
      *out_len = len;
      if (out_desc) {
        snprintf(desc, (size_t)dn + 1, "LLVM %s %s cpu=%s features=%s", SMELT_LLVM_VERSION, t.triple, t.cpu,
                 t.features);
        *out_desc = desc;
      }
    }
  }
  if (buf) LLVMDisposeMemoryBuffer(buf);
  mod_free(&m);
  target_free(&t);
  return st;
}

smelt_status cg_llvm_ir_text(Graph *g, Kernel *k, int nk, const CgLlvmOptions *opt, bool optimised, char **out_text) {
  *out_text = NULL;
  Target t;
  RETURN_IF_ERROR(target_create(opt, &t));
  CgMod m;
  smelt_status st = build_module(&m, &t, opt, g, k, nk, optimised);
  if (!st) {
    char *s = LLVMPrintModuleToString(m.mod);
    *out_text = strdup(s);
    LLVMDisposeMessage(s);
    if (!*out_text) st = st_error(ST_NO_MEMORY, "out of memory printing LLVM IR");
  }
  mod_free(&m);
  target_free(&t);
  return st;
}
