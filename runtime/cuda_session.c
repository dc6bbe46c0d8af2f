/* CUDA sessions.
 *
 * A CUDA session owns a device object (runtime/cuda_driver.h: the primary
 * context, a stream of its own), one module per compilation unit (the cubin
 * for this GPU, else the session's compiler hook on the bundle's source,
 * else PTX), the constants uploaded once at creation, a device arena laid
 * out by the same memory plan, and a CUDA graph of the whole kernel
 * sequence, captured on the first run and replayed after.  A graph keeps
 * the device addresses it was captured with, so every kernel argument must
 * be an address that stays put: inputs and outputs bound in host memory (or
 * in device memory that is not 64-byte aligned, which the kernels assume)
 * go through device staging buffers the session owns, copied in before and
 * out after each replay; device memory bound by the user is used as is, and
 * when a later binding changes any argument address the graph is captured
 * again (the argument values of the last capture are kept to compare with).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/internal.h"
#include "runtime/nccl.h"

/* ---- CUDA sessions: creation ---- */

/* The bundle's compiled forms of unit u: one image per arch with a cubin
 * and/or PTX section named "ARCH/uU" under the specialisation's prefix. */
static int unit_images(const smelt_bundle *b, int u, RtCudaImage *img, char (*arch)[16], int cap) {
  char suffix[32];
  int n = snprintf(suffix, sizeof suffix, "/u%d", u), count = 0;
  size_t sl = (size_t)n;
  for (int i = 0; i < fmt_file_section_count(b->file); i++) {
    const FmtSection *sec = fmt_file_section_at(b->file, i);
    if (sec->kind != FMT_SEC_CUBIN && sec->kind != FMT_SEC_PTX) continue;
    size_t pl = strlen(b->prefix);
    if (strncmp(sec->name, b->prefix, pl) != 0) continue;
    const char *rel = sec->name + pl;
    size_t nl = strlen(rel);
    if (nl <= sl || nl - sl >= 16 || strcmp(rel + nl - sl, suffix) != 0 || memchr(rel, '/', nl - sl)) continue;
    char a[16];
    snprintf(a, sizeof a, "%.*s", (int)(nl - sl), rel);
    int j = 0;
    while (j < count && strcmp(arch[j], a) != 0) j++;
    if (j == count) {
      if (count == cap) continue;
      memset(&img[count], 0, sizeof img[count]);
      snprintf(arch[count], 16, "%s", a);
      img[count].arch = arch[count];
      count++;
    }
    if (sec->kind == FMT_SEC_CUBIN) {
      img[j].cubin = sec->size ? sec->data : NULL;
      img[j].cubin_len = sec->size;
    } else if (sec->size > 0 && ((const char *)sec->data)[sec->size - 1] == 0) {
      /* PTX without its NUL would be read past its end: ignored */
      img[j].ptx = sec->data;
    }
  }
  return count;
}

/* Loads every unit (cubin for this GPU, else NVRTC, else PTX) and finds
 * every kernel. */
static smelt_status cuda_load_modules(smelt_session *s) {
  const smelt_bundle *b = s->b;
  CudaState *cu = s->r->cu;
  const FmtCudaModule *m = b->cuda;
  const char *path = fmt_file_path(b->file);
  cu->mods = calloc((size_t)m->nunits, sizeof *cu->mods);
  cu->loaded = calloc((size_t)m->nunits, sizeof *cu->loaded);
  cu->fns = calloc((size_t)m->nkernels + 1, sizeof *cu->fns);
  if (!cu->mods || !cu->loaded || !cu->fns) return st_error(ST_NO_MEMORY, "out of memory");
  for (int u = 0; u < m->nunits; u++) {
    RtCudaImage img[2 * FMT_MAX_CUDA_ARCHS];
    char arch[2 * FMT_MAX_CUDA_ARCHS][16];
    int n = unit_images(b, u, img, arch, 2 * FMT_MAX_CUDA_ARCHS);
    char what[96];
    snprintf(what, sizeof what, "unit u%d of %s", u, path);
    RETURN_IF_ERROR(rt_cuda_module_load(cu->dev, img, n, m->units[u], what, &cu->mods[u], &cu->loaded[u]));
  }
  for (int k = 0; k < m->nkernels; k++) {
    const FmtCudaLaunch *l = &m->kernels[k];
    if (fmt_cuda_launch_is_collective(l)) continue; /* issued by runtime/nccl.c */
    smelt_status st = rt_cuda_module_function(cu->mods[l->unit], l->symbol, l->smem, &cu->fns[k]);
    if (st) return st_prefix(st, "%s: kernel '%s'", path, l->name);
  }
  return NULL;
}

/* The device address of every constant of g (into ptrs, by value id):
 * a tensor another specialisation of the session already uploaded (the
 * same host bytes) is shared; the others go into one new block. */
static smelt_status place_constants(smelt_session *s, const Graph *g, RtCudaPtr *ptrs) {
  RtCudaDevice *d = s->dev;
  size_t total = 0;
  for (int v = 0; v < g->nval; v++) {
    ptrs[v] = 0;
    const Value *val = &g->val[v];
    if (val->kind != VK_CONST) continue;
    size_t n = ir_type_bytes(&val->type);
    for (int i = 0; val->data && i < s->nconsts && !ptrs[v]; i++)
      if (s->consts[i].host == val->data && s->consts[i].bytes == n) ptrs[v] = s->consts[i].dev;
    if (!ptrs[v]) total = (total + 255) / 256 * 256 + n;
  }
  if (total == 0) return NULL;
  RtCudaPtr *blocks = realloc(s->const_blocks, sizeof *blocks * (size_t)(s->nblocks + 1));
  if (!blocks) return st_error(ST_NO_MEMORY, "out of memory");
  s->const_blocks = blocks;
  RtCudaPtr block;
  RETURN_IF_ERROR(rt_cuda_alloc(d, total, &block));
  s->const_blocks[s->nblocks++] = block;
  size_t off = 0;
  for (int v = 0; v < g->nval; v++) {
    const Value *val = &g->val[v];
    if (val->kind != VK_CONST || ptrs[v]) continue;
    off = (off + 255) / 256 * 256;
    size_t n = ir_type_bytes(&val->type);
    smelt_status st = val->data ? rt_cuda_upload(d, block + off, val->data, n) : rt_cuda_memset(d, block + off, 0, n);
    if (st) return st_prefix(st, "constant '%s'", val->name);
    ptrs[v] = block + off;
    off += n;
    if (!val->data) continue;
    if (s->nconsts == s->cap_consts) {
      int cap = s->cap_consts ? 2 * s->cap_consts : 64;
      RtCudaConst *c = realloc(s->consts, sizeof *c * (size_t)cap);
      if (!c) return st_error(ST_NO_MEMORY, "out of memory");
      s->consts = c;
      s->cap_consts = cap;
    }
    s->consts[s->nconsts++] = (RtCudaConst){val->data, n, ptrs[v]};
  }
  return NULL;
}

void rt_cuda_session_free_constants(smelt_session *s) {
  for (int i = 0; s->dev && i < s->nblocks; i++) rt_cuda_free(s->dev, s->const_blocks[i]);
  free(s->const_blocks);
  free(s->consts);
  s->const_blocks = NULL;
  s->consts = NULL;
  s->nblocks = s->nconsts = s->cap_consts = 0;
}

/* Device memory for what lives on the device for the session's life:
 * constants, the arena, intermediates off the plan. */
static smelt_status cuda_place(smelt_session *s) {
  const smelt_bundle *b = s->b;
  const Graph *g = b->g;
  CudaState *cu = s->r->cu;
  RETURN_IF_ERROR(place_constants(s, g, cu->const_ptr));
  if (g->arena_bytes > 0) RETURN_IF_ERROR(rt_cuda_alloc(cu->dev, (size_t)g->arena_bytes, &cu->arena));
  /* states and the scatter results that update them: the session's memory */
  for (int v = 0; v < g->nval; v++) {
    int sv = ir_state_of(g, v);
    for (int i = 0; sv >= 0 && i < g->nstates; i++)
      if (g->states[i] == sv) cu->dptr[v] = s->state_dev[i];
  }
  for (int k = 0; k < b->nkernels; k++) {
    const Kernel *kn = &b->kernels[k];
    for (int a = kn->nargs - kn->nouts; a < kn->nargs; a++) {
      int v = kn->args[a];
      if (rt_is_graph_output(g, v) || cu->dptr[v]) continue;
      const Value *val = &g->val[v];
      if (cu->arena && val->mem_offset >= 0) {
        cu->dptr[v] = cu->arena + (RtCudaPtr)val->mem_offset;
        continue;
      }
      smelt_status st = rt_cuda_alloc(cu->dev, ir_type_bytes(&val->type), &cu->own[v]);
      if (st) return st_prefix(st, "buffer of '%s'", val->name);
      cu->dptr[v] = cu->own[v];
    }
  }
  for (int v = 0; v < g->nval; v++)
    if (g->val[v].kind == VK_CONST) cu->dptr[v] = cu->const_ptr[v];
  return NULL;
}

/* ---- collectives (tensor parallelism) ---- */

/* What a collective kernel's launch needs when it is issued. */
typedef struct RtCudaColl {
  smelt_session *s;
  CudaState *cu;
  const smelt_bundle *b; /* the specialisation */
  const RtRun *run;      /* its run state */
  int k;
  RtCudaPtr stage;       /* all_gather of several blocks: NCCL's rank-major result */
} RtCudaColl;

/* Queues kernel k, an all_reduce or all_gather, on the rank's stream
 * through NCCL, at the argument addresses of the run (a graph being
 * captured keeps the call).  An all_reduce over a tensor with a ranged
 * axis sums the rows this run has; an all_gather moves the whole tensor
 * (its blocks are laid out at the max either way). */
static smelt_status coll_enqueue(void *ctx, void *stream) {
  const RtCudaColl *c = ctx;
  smelt_session *s = c->s;
  const Graph *g = c->b->g;
  const Kernel *kn = &c->b->kernels[c->k];
  const Node *n = &g->node[g->groups[kn->group].anchor];
  if (!s->nccl)
    return st_error(ST_UNSUPPORTED, "kernel '%s' (%s): the ranks share a GPU, so their collectives go through host "
                    "memory and cannot be queued on a stream or captured (give each rank a GPU of its own)", kn->name,
                    ir_op_name(n->op));
  const RtCudaPtr *argv = c->cu->argval + c->run->argv_at[c->k];
  const TensorType *out = &g->val[kn->args[1]].type;
  smelt_status st;
  if (n->op == OP_ALL_REDUCE) {
    size_t count = 1, run = ir_type_bytes(out), full = run;
    if (ir_type_dynamic(out)) rt_ranged_blocks(out, c->run->ranges, &count, &run, &full);
    size_t bytes = count ? (count - 1) * full + run : 0;
    st = rt_nccl_all_reduce(s->nccl, s->rank, (const void *)(uintptr_t)argv[0], (void *)(uintptr_t)argv[1],
                            bytes / dt_size(out->dt), out->dt, stream);
  } else {
    /* NCCL gives rank r's outer blocks together; block o of rank r goes to
     * (o * nranks + r) * block (a concatenation along the axis) */
    size_t outer, block;
    rt_all_gather_blocks(g, kn, &outer, &block);
    RtCudaPtr to = outer > 1 ? c->stage : argv[1];
    st = rt_nccl_all_gather(s->nccl, s->rank, (const void *)(uintptr_t)argv[0], (void *)(uintptr_t)to, outer * block,
                            stream);
    for (int r = 0; !st && outer > 1 && r < s->nranks; r++)
      st = rt_cuda_copy_2d_async(s->dev, argv[1] + (size_t)r * block, (size_t)s->nranks * block,
                                 c->stage + (size_t)r * outer * block, block, block, outer);
  }
  return st ? st_prefix(st, "kernel '%s'", kn->name) : NULL;
}

smelt_status rt_cuda_session_create(smelt_session *s, size_t nargs) {
  const smelt_bundle *b = s->b;
  size_t nval = (size_t)b->g->nval ? (size_t)b->g->nval : 1;
  CudaState *cu = s->r->cu = calloc(1, sizeof *cu);
  if (!cu) return st_error(ST_NO_MEMORY, "out of memory creating a session");
  cu->dev = s->dev; /* the session's */
  if (b->nkernels > 0 && !b->cuda)
    return st_error(ST_UNSUPPORTED, "%s: error: the bundle has no CUDA kernels (it was compiled for --target cpu; "
                    "compile with --target cuda or cpu,cuda)", fmt_file_path(b->file));
  cu->const_ptr = calloc(nval, sizeof *cu->const_ptr);
  cu->own = calloc(nval, sizeof *cu->own);
  cu->dptr = calloc(nval, sizeof *cu->dptr);
  cu->staged = calloc(nval, sizeof *cu->staged);
  cu->mirror = calloc(nval, sizeof *cu->mirror);
  cu->argval = calloc(nargs ? nargs : 1, sizeof *cu->argval);
  cu->captured = calloc(nargs ? nargs : 1, sizeof *cu->captured);
  /* beyond the arguments: a workspace pointer and the TMA descriptors */
  uint64_t ws_bytes = 0;
  size_t ntmaps = 0;
  for (int k = 0; b->cuda && k < b->nkernels; k++) {
    const FmtCudaLaunch *l = &b->cuda->kernels[k];
    if (l->workspace > ws_bytes) ws_bytes = l->workspace;
    ntmaps += (size_t)l->ntmaps;
  }
  size_t nparams = nargs + 2 * (size_t)b->nkernels + ntmaps;
  cu->params = calloc(nparams ? nparams : 1, sizeof *cu->params);
  cu->launches = calloc(b->nkernels ? (size_t)b->nkernels : 1, sizeof *cu->launches);
  cu->tmap_at = calloc(b->nkernels ? (size_t)b->nkernels : 1, sizeof *cu->tmap_at);
  cu->tmaps = ntmaps ? aligned_alloc(64, ntmaps * 128) : NULL;
  cu->tmap_base = calloc(ntmaps ? ntmaps : 1, sizeof *cu->tmap_base);
  cu->colls = calloc(b->nkernels ? (size_t)b->nkernels : 1, sizeof *cu->colls);
  if (!cu->colls || !cu->const_ptr || !cu->own || !cu->dptr || !cu->staged || !cu->mirror || !cu->argval || !cu->captured ||
      !cu->params || !cu->launches || !cu->tmap_at || !cu->tmap_base || (ntmaps && !cu->tmaps))
    return st_error(ST_NO_MEMORY, "out of memory creating a session");
  if (ntmaps) memset(cu->tmaps, 0, ntmaps * 128);
  if (b->cuda) RETURN_IF_ERROR(cuda_load_modules(s));
  RETURN_IF_ERROR(cuda_place(s));
  if (b->g->nranges) {
    RETURN_IF_ERROR(rt_cuda_alloc(cu->dev, sizeof s->r->ranges, &cu->rng));
    RETURN_IF_ERROR(rt_cuda_upload(cu->dev, cu->rng, s->r->ranges, sizeof s->r->ranges));
  }
  if (ws_bytes) {
    RETURN_IF_ERROR(rt_cuda_alloc(cu->dev, (size_t)ws_bytes, &cu->ws));
    RETURN_IF_ERROR(rt_cuda_memset(cu->dev, cu->ws, 0, (size_t)ws_bytes));
  }
  size_t at = 0;
  int tm = 0;
  bool pdl = rt_cuda_device_has_pdl(cu->dev);
  for (int k = 0; k < b->nkernels; k++) {
    const FmtCudaLaunch *l = &b->cuda->kernels[k];
    if (fmt_cuda_launch_is_collective(l)) {
      const Kernel *kn = &b->kernels[k];
      RtCudaColl *c = &cu->colls[k];
      *c = (RtCudaColl){.s = s, .cu = cu, .b = b, .run = s->r, .k = k};
      const Node *n = &b->g->node[b->g->groups[kn->group].anchor];
      if (n->op == OP_ALL_GATHER && kn->nargs == 2) {
        size_t outer, block;
        rt_all_gather_blocks(b->g, kn, &outer, &block);
        if (outer > 1) RETURN_IF_ERROR(rt_cuda_alloc(cu->dev, outer * block * (size_t)b->nranks, &c->stage));
      }
      if (kn->nargs != 2)
        return st_error(ST_INVALID_INPUT, "%s: collective kernel '%s' has %d arguments", fmt_file_path(b->file),
                        kn->name, kn->nargs);
      cu->has_colls = true;
      cu->launches[k] = (RtCudaLaunch){.name = l->name, .enqueue = coll_enqueue, .ctx = c};
      cu->tmap_at[k] = tm;
      continue;
    }
    void **p = cu->params + at;
    int n = 0;
    for (int a = 0; a < b->kernels[k].nargs; a++) p[n++] = &cu->argval[s->r->argv_at[k] + a];
    if (b->g->nranges) p[n++] = &cu->rng; /* codegen/cuda/module.c */
    if (l->workspace) p[n++] = &cu->ws;
    cu->tmap_at[k] = tm;
    for (int t = 0; t < l->ntmaps; t++) p[n++] = cu->tmaps + (size_t)(tm++) * 128;
    at += (size_t)n;
    cu->launches[k] = (RtCudaLaunch){.fn = cu->fns[k], .name = l->name, .grid = {l->grid[0], l->grid[1], l->grid[2]},
                                     .block = {l->block[0], l->block[1], l->block[2]}, .smem = l->smem, .params = p,
                                     .pdl = pdl && l->pdl && rt_cuda_module_code_cc(cu->mods[l->unit]) >= 90};
  }
  return NULL;
}

/* Encodes the TMA descriptors whose tensors moved since they were last
 * encoded (a descriptor holds its tensor's address; with the session's own
 * buffers that is once, at the first run). */
static smelt_status cuda_encode_tmaps(smelt_session *s) {
  const smelt_bundle *b = s->b;
  CudaState *cu = s->r->cu;
  for (int k = 0; b->cuda && k < b->nkernels; k++) {
    const FmtCudaLaunch *l = &b->cuda->kernels[k];
    for (int t = 0; t < l->ntmaps; t++) {
      const FmtCudaTmap *m = &l->tmaps[t];
      RtCudaPtr base = cu->argval[s->r->argv_at[k] + m->arg];
      int at = cu->tmap_at[k] + t;
      if (cu->tmap_base[at] == base) continue;
      smelt_status st = rt_cuda_tensor_map(cu->dev, m->dtype, m->rank, base, m->dims, m->strides, m->box, m->swizzle,
                                           cu->tmaps + (size_t)at * 128);
      if (st) return st_prefix(st, "kernel '%s'", l->name);
      cu->tmap_base[at] = base;
    }
  }
  return NULL;
}

void rt_cuda_session_destroy(smelt_session *s) {
  CudaState *cu = s->r->cu;
  if (!cu) return;
  const Graph *g = s->b->g;
  rt_cuda_graph_destroy(cu->graph);
  if (cu->dev) {
    for (int v = 0; cu->own && v < g->nval; v++) rt_cuda_free(cu->dev, cu->own[v]);
    rt_cuda_free(cu->dev, cu->arena);
    rt_cuda_free(cu->dev, cu->const_block);
    rt_cuda_free(cu->dev, cu->ws);
    rt_cuda_free(cu->dev, cu->rng);
    for (int k = 0; cu->colls && k < s->b->nkernels; k++) rt_cuda_free(cu->dev, cu->colls[k].stage);
    for (int u = 0; cu->mods && u < s->b->cuda->nunits; u++) rt_cuda_module_unload(cu->mods[u]);
  }
  for (int v = 0; cu->mirror && v < g->nval; v++) free(cu->mirror[v]);
  free(cu->mods), free(cu->loaded), free(cu->fns), free(cu->const_ptr), free(cu->own);
  free(cu->dptr), free(cu->staged), free(cu->mirror), free(cu->argval), free(cu->captured), free(cu->params);
  free(cu->launches), free(cu->tmaps), free(cu->tmap_at), free(cu->tmap_base), free(cu->colls);
  free(cu);
}

/* ---- CUDA sessions: running ---- */

/* Gives value v, bound by the user at p (n bytes), its device address: p
 * itself when it is device memory aligned as the kernels assume, else the
 * value's staging buffer. */
static smelt_status cuda_bind(smelt_session *s, int v, const void *p, size_t n) {
  CudaState *cu = s->r->cu;
  const TensorType *t = &s->b->g->val[v].type;
  bool ranged = ir_type_dynamic(t);
  if (!ranged && p && (uintptr_t)p % 64 == 0 && rt_cuda_is_local_pointer(cu->dev, p)) {
    cu->dptr[v] = (RtCudaPtr)(uintptr_t)p;
    cu->staged[v] = false;
    return NULL;
  }
  if (!cu->own[v]) {
    smelt_status st = rt_cuda_alloc(cu->dev, n, &cu->own[v]);
    /* laid out at the max: the rows beyond a run's are zero until a run
     * has them (the kernels read them, and nothing they feed is kept) */
    if (!st && ranged) st = rt_cuda_memset(cu->dev, cu->own[v], 0, n);
    if (st) return st_prefix(st, "staging buffer of '%s'", s->b->g->val[v].name);
  }
  cu->dptr[v] = cu->own[v];
  cu->staged[v] = true;
  return NULL;
}

smelt_status rt_cuda_session_prepare(smelt_session *s) {
  const smelt_bundle *b = s->b;
  const Graph *g = b->g;
  CudaState *cu = s->r->cu;
  for (int i = 0; i < g->ninputs; i++) {
    int v = g->inputs[i];
    RETURN_IF_ERROR(cuda_bind(s, v, s->in_ptr[i], ir_type_bytes(&g->val[v].type)));
  }
  /* A node result bound to several output slots is computed once, into the
   * first slot's memory; rt_session_finish copies it to the others. */
  for (int i = 0; i < g->noutputs; i++) {
    int v = g->outputs[i];
    bool first = true;
    for (int j = 0; j < i; j++) first = first && g->outputs[j] != v;
    if (g->val[v].kind == VK_NODE && first)
      RETURN_IF_ERROR(cuda_bind(s, v, s->out_ptr[i], ir_type_bytes(&g->val[v].type)));
  }
  for (int i = 0; i < g->ninputs; i++) {
    int v = g->inputs[i];
    const TensorType *t = &g->val[v].type;
    size_t n = ir_type_bytes(t), count = 1, run = n, full = n;
    if (!cu->staged[v] || n == 0) continue;
    if (ir_type_dynamic(t)) rt_ranged_blocks(t, s->r->ranges, &count, &run, &full);
    smelt_status st = NULL;
    for (size_t p = 0; p < count && !st; p++)
      st = rt_cuda_upload_input(cu->dev, cu->dptr[v] + p * full, (const char *)s->in_ptr[i] + p * run, run);
    if (st) return st_prefix(st, "input '%s'", g->val[v].name);
  }
  /* the ranges' values of this run, read by the kernels through rng */
  if (g->nranges) {
    smelt_status st = rt_cuda_upload_input(cu->dev, cu->rng, s->r->ranges, sizeof s->r->ranges);
    if (st) return st_prefix(st, "the values of the ranged dims");
  }
  for (int k = 0; k < b->nkernels; k++) {
    const Kernel *kn = &b->kernels[k];
    for (int a = 0; a < kn->nargs; a++) cu->argval[s->r->argv_at[k] + a] = cu->dptr[kn->args[a]];
  }
  return cuda_encode_tmaps(s);
}

static size_t total_args(const smelt_bundle *b) {
  size_t n = 0;
  for (int k = 0; k < b->nkernels; k++) n += (size_t)b->kernels[k].nargs;
  return n;
}

/* Captures the kernel sequence into a CUDA graph, unless the graph held
 * was captured with exactly the current argument addresses. */
static smelt_status cuda_ensure_graph(smelt_session *s) {
  CudaState *cu = s->r->cu;
  size_t n = total_args(s->b);
  /* a collective's size follows the ranged dims (coll_enqueue) */
  bool same_ranges = !cu->has_colls || memcmp(cu->captured_ranges, s->r->ranges, sizeof s->r->ranges) == 0;
  if (cu->graph && same_ranges && memcmp(cu->captured, cu->argval, n * sizeof *cu->argval) == 0) return NULL;
  rt_cuda_graph_destroy(cu->graph);
  cu->graph = NULL;
  smelt_status st = rt_cuda_graph_capture(cu->dev, cu->launches, s->b->nkernels, &cu->graph);
  if (st) return st_prefix(st, "%s: capturing the CUDA graph", fmt_file_path(s->b->file));
  memcpy(cu->captured, cu->argval, n * sizeof *cu->argval);
  memcpy(cu->captured_ranges, s->r->ranges, sizeof s->r->ranges);
  return NULL;
}

/* Copies each result computed elsewhere than its bound memory (staged:
 * host memory, or device memory off the kernels' alignment; a constant or
 * input as output; a second slot of one value) to that memory: waiting
 * for each copy, or (queued, every output in device memory) only queuing
 * it on the stream after the kernels. */
static smelt_status copy_outputs(smelt_session *s, bool queued) {
  const Graph *g = s->b->g;
  CudaState *cu = s->r->cu;
  for (int i = 0; i < g->noutputs; i++) {
    int v = g->outputs[i];
    const TensorType *t = &g->val[v].type;
    size_t n = ir_type_bytes(t), count = 1, run = n, full = n;
    if (n == 0 || (uintptr_t)s->out_ptr[i] == cu->dptr[v]) continue;
    /* with a ranged axis: the run's rows of each block, packed */
    if (ir_type_dynamic(t)) rt_ranged_blocks(t, s->r->ranges, &count, &run, &full);
    smelt_status st = NULL;
    for (size_t p = 0; p < count && !st; p++) {
      char *dst = (char *)s->out_ptr[i] + p * run;
      RtCudaPtr src = cu->dptr[v] + p * full;
      st = queued ? rt_cuda_copy_async(cu->dev, (RtCudaPtr)(uintptr_t)dst, src, run) : rt_cuda_download(cu->dev, dst, src, run);
    }
    if (st) return st_prefix(st, "output '%s'", g->val[v].name);
  }
  return NULL;
}

smelt_status rt_cuda_session_finish(smelt_session *s) { return copy_outputs(s, false); }

/* A failure of the queued kernels, as the run reports it. */
static smelt_status graph_failed(const smelt_session *s, smelt_status st) {
  /* A kernel that faults poisons the context: it cannot be found by
   * running the kernels again one by one in this session. */
  return st_prefix(st, "%s: running the CUDA graph of %d kernels (smelt run --check=groups runs them one at a time "
                   "and names the failing one)", fmt_file_path(s->b->file), s->b->nkernels);
}

smelt_status rt_cuda_session_run(smelt_session *s) {
  RETURN_IF_ERROR(rt_session_prepare_one(s));
  CudaState *cu = s->r->cu;
  if (s->b->nkernels > 0) {
    RETURN_IF_ERROR(cuda_ensure_graph(s));
    smelt_status st = rt_cuda_graph_launch(cu->dev, cu->graph);
    if (!st) st = rt_cuda_sync(cu->dev);
    if (st) return graph_failed(s, st);
  }
  return rt_cuda_session_finish(s);
}

smelt_status rt_cuda_check_enqueue_outputs(const smelt_session *s) {
  const Graph *g = s->b->g;
  /* every result must land in device memory: nothing is copied back */
  for (int i = 0; i < g->noutputs; i++)
    if (ir_type_bytes(&g->val[g->outputs[i]].type) > 0 && !rt_cuda_is_device_pointer(s->dev, s->out_ptr[i]))
      return st_error(ST_INVALID_INPUT, "smelt_session_enqueue: output '%s' is bound to host memory; bind device memory "
                      "(smelt_session_cuda_alloc) or use smelt_session_run", g->val[g->outputs[i]].name);
  return NULL;
}

smelt_status rt_cuda_session_enqueue(smelt_session *s) {
  RETURN_IF_ERROR(rt_cuda_check_enqueue_outputs(s));
  RETURN_IF_ERROR(rt_session_prepare_one(s));
  CudaState *cu = s->r->cu;
  if (s->b->nkernels > 0) {
    RETURN_IF_ERROR(cuda_ensure_graph(s));
    smelt_status st = rt_cuda_graph_launch(cu->dev, cu->graph);
    if (st) return graph_failed(s, st);
  }
  return copy_outputs(s, true);
}

smelt_status rt_cuda_session_synchronize(smelt_session *s) {
  smelt_status st = rt_cuda_sync(s->r->cu->dev);
  return st ? graph_failed(s, st) : NULL;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + 1e-6 * (double)ts.tv_nsec;
}

RtCudaDevice *rt_session_cuda_device(smelt_session *s) { return s->dev; }

void rt_session_cuda_loaded(const smelt_session *s, char *buf, size_t cap) {
  int count[3] = {0, 0, 0};
  int nunits = s->r && s->r->cu && s->b->cuda ? s->b->cuda->nunits : 0;
  for (int u = 0; u < nunits; u++) count[s->r->cu->loaded[u]]++;
  snprintf(buf, cap, "%d unit%s: %d from cubins, %d compiled by NVRTC now, %d from PTX", nunits,
           nunits == 1 ? "" : "s", count[RT_CUDA_LOADED_CUBIN], count[RT_CUDA_LOADED_NVRTC], count[RT_CUDA_LOADED_PTX]);
}

smelt_status rt_session_cuda_time_kernels(smelt_session *s, int iters, double *out_ms) {
  if (s->peers) return rt_ranks_time(s, RT_STEP_TIME_KERNELS, iters, 1, out_ms);
  return rt_cuda_session_time_kernels(s, iters, out_ms);
}

smelt_status rt_session_cuda_time_graph(smelt_session *s, int reps, int batch, double *out_ms) {
  if (s->peers) return rt_ranks_time(s, RT_STEP_TIME_GRAPH, reps, batch, out_ms);
  return rt_cuda_session_time_graph(s, reps, batch, out_ms);
}

void rt_cuda_session_drop_graphs(smelt_session *s) {
  for (int i = 0; s->runs && s->made && i < s->root->nspecs; i++) {
    CudaState *cu = s->made[i] ? s->runs[i].cu : NULL;
    if (!cu) continue;
    rt_cuda_graph_destroy(cu->graph);
    cu->graph = NULL;
  }
}

smelt_status rt_cuda_session_time_kernels(smelt_session *s, int iters, double *out_ms) {
  CudaState *cu = s->r ? s->r->cu : NULL;
  int nk = s->b->nkernels;
  if (!cu) return st_error(ST_INVALID_INPUT, "rt_session_cuda_time_kernels: not a CUDA session");
  if (nk == 0) return NULL;
  double *one = malloc((size_t)nk * sizeof *one);
  if (!one) return st_error(ST_NO_MEMORY, "out of memory");
  smelt_status st = NULL;
  for (int i = 0; i < iters && !st; i++) {
    st = rt_cuda_time_kernels(cu->dev, cu->launches, nk, 1, one);
    for (int k = 0; k < nk && !st; k++) out_ms[(size_t)k * (size_t)iters + (size_t)i] = one[k];
  }
  free(one);
  return st;
}

smelt_status rt_cuda_session_time_graph(smelt_session *s, int reps, int batch, double *out_ms) {
  CudaState *cu = s->r ? s->r->cu : NULL;
  if (!cu) return st_error(ST_INVALID_INPUT, "rt_session_cuda_time_graph: not a CUDA session");
  if (s->b->nkernels == 0) {
    for (int r = 0; r < reps; r++) out_ms[r] = 0;
    return NULL;
  }
  if (!cu->graph) return st_error(ST_INVALID_INPUT, "rt_session_cuda_time_graph: no graph yet: run the session first");
  if (batch < 1) batch = 1;
  for (int r = 0; r < reps; r++) {
    double t0 = now_ms();
    for (int i = 0; i < batch; i++) RETURN_IF_ERROR(rt_cuda_graph_launch(cu->dev, cu->graph));
    RETURN_IF_ERROR(rt_cuda_sync(cu->dev));
    out_ms[r] = (now_ms() - t0) / batch;
  }
  return NULL;
}


/* ---- the public API's CUDA extras (include/smelt.h) ---- */

static smelt_status not_cuda(const char *fn) {
  return st_error(ST_UNSUPPORTED, "%s: the session runs on the CPU (it has no CUDA stream or device)", fn);
}

smelt_status smelt_session_cuda_stream(const smelt_session *s, void **out_stream) {
  *out_stream = NULL;
  if (!s->dev) return not_cuda("smelt_session_cuda_stream");
  *out_stream = rt_cuda_device_stream(s->dev);
  return NULL;
}

/* A smelt_cuda_buffer is an RtCudaBuffer (runtime/cuda_driver.h). */
smelt_status smelt_session_cuda_alloc(smelt_session *s, size_t bytes, smelt_cuda_buffer **out_buffer) {
  *out_buffer = NULL;
  if (!s->dev) return not_cuda("smelt_session_cuda_alloc");
  RtCudaBuffer *b;
  RETURN_IF_ERROR(rt_cuda_buffer_alloc(s->dev, bytes, &b));
  *out_buffer = (smelt_cuda_buffer *)b;
  return NULL;
}

void *smelt_cuda_buffer_data(const smelt_cuda_buffer *buffer) {
  return buffer ? (void *)(uintptr_t)rt_cuda_buffer_ptr((const RtCudaBuffer *)buffer) : NULL;
}

void smelt_cuda_buffer_free(smelt_cuda_buffer *buffer) { rt_cuda_buffer_free((RtCudaBuffer *)buffer); }
