/* Tensor-parallel sessions: one session per rank of a bundle compiled
 * with --tp, driven together (runtime/comm.h says why as threads of one
 * process).
 *
 * The caller's session is rank 0's; it holds the others (peers) and
 * forwards to them what the public API does to it: an input bound is bound
 * on every rank (the same memory: each rank reads the whole input), an
 * output gets a buffer of its own on the other ranks (the shard pass makes
 * every output whole, so rank 0's is the answer), a specialisation chosen
 * or a state reset is chosen or reset on every rank.  A run is one step of
 * the crew: every rank runs its whole kernel table on its thread, meeting
 * the others at each collective kernel.  bench and check step kernel by
 * kernel (rt_session_run_kernel), which runs kernel k on every rank at
 * once; the loader checked that the ranks' collectives line up.
 */
#include <stdlib.h>
#include <string.h>

#include "runtime/comm.h"
#include "runtime/internal.h"
#include "runtime/nccl.h"

/* CUDA ranks' collectives: NCCL when every rank has a GPU of its own,
 * else (ranks sharing a GPU: a test of the sharded kernels on a machine of
 * one) through host memory, kernel by kernel, without a CUDA graph. */
static smelt_status cuda_collectives(smelt_session *s, const int *ordinals) {
  int n = s->nranks;
  bool shared = false;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < i; j++) shared = shared || ordinals[i] == ordinals[j];
  if (shared) return NULL;
  smelt_status st = rt_nccl_create(n, ordinals, &s->nccl);
  if (st) return st_prefix(st, "%s: %d tensor-parallel ranks on %d GPUs", fmt_file_path(s->root->file), n, n);
  for (int r = 1; r < n; r++) s->peers[r - 1]->nccl = s->nccl;
  return NULL;
}

smelt_status rt_ranks_session_create(smelt_bundle *b, int threads, const smelt_session_options *options, bool cuda,
                                     const int *ordinals, smelt_session **out_session) {
  *out_session = NULL;
  int n = b->nranks;
  /* the threads split between the ranks, at least one each (each rank's
   * own thread is the first of its pool) */
  int per = threads / n > 0 ? threads / n : 1;
  smelt_session *s = NULL;
  RETURN_IF_ERROR(rt_session_create_one(b, cuda, cuda ? ordinals[0] : 0, per, options, &s));
  smelt_status st = NULL;
  s->nranks = n;
  size_t nout = (size_t)(b->g->noutputs + 1);
  if (!(s->peers = calloc((size_t)n, sizeof *s->peers)) || !(s->scratch = calloc(nout, sizeof *s->scratch)) ||
      !(s->scratch_bytes = calloc(nout, sizeof *s->scratch_bytes)) ||
      !(s->dev_scratch = calloc(nout * (size_t)n, sizeof *s->dev_scratch)))
    st = st_error(ST_NO_MEMORY, "out of memory creating a session");
  if (!st) st = rt_comm_create(n, &s->comm);
  if (!st) st = rt_crew_create(n, &s->crew);
  for (int r = 1; r < n && !st; r++) {
    st = rt_session_create_one(b->ranks[r], cuda, cuda ? ordinals[r] : 0, per, options, &s->peers[r - 1]);
    if (st) st = st_prefix(st, "rank %d", r);
    else s->peers[r - 1]->comm = s->comm, s->peers[r - 1]->nranks = n;
  }
  if (!st && cuda) st = cuda_collectives(s, ordinals);
  if (st) {
    smelt_session_destroy(s);
    return st;
  }
  *out_session = s;
  return NULL;
}

void rt_ranks_session_free(smelt_session *s) {
  if (!s->peers) {
    s->comm = NULL; /* a peer's is its rank 0's */
    s->nccl = NULL;
    return;
  }
  /* the graphs hold NCCL's collectives: they go before the communicators,
   * and those before the devices */
  for (int r = 0; r < s->nranks; r++) {
    smelt_session *x = r ? s->peers[r - 1] : s;
    if (x && x->cuda) rt_cuda_session_drop_graphs(x);
  }
  rt_nccl_destroy(s->nccl);
  s->nccl = NULL;
  size_t nout = (size_t)s->b->g->noutputs;
  for (size_t i = 0; s->dev_scratch && i < nout * (size_t)s->nranks; i++) smelt_cuda_buffer_free(s->dev_scratch[i]);
  free(s->dev_scratch);
  s->dev_scratch = NULL;
  for (int r = 1; r < s->nranks; r++)
    if (s->peers[r - 1]) {
      free(s->peers[r - 1]->scratch);
      smelt_session_destroy(s->peers[r - 1]);
    }
  free(s->peers);
  s->peers = NULL;
  for (int i = 0; s->scratch && i < s->b->g->noutputs; i++) free(s->scratch[i]);
  free(s->scratch);
  free(s->scratch_bytes);
  rt_crew_destroy(s->crew);
  rt_comm_destroy(s->comm);
  s->crew = NULL, s->comm = NULL;
}

smelt_status rt_ranks_bind(smelt_session *s, bool input, const char *name, const void *data, const Binding *bd) {
  const Graph *g = s->b->g;
  int slot = -1;
  for (int i = 0; !input && i < g->noutputs && slot < 0; i++)
    if (strcmp(g->val[g->outputs[i]].name, name) == 0) slot = i;
  if (!input && slot < 0) return st_error(ST_INTERNAL, "output '%s' bound on rank 0 only", name);
  if (!input && s->cuda) {
    /* on the GPU, each peer's in its own device memory: never copied */
    for (int r = 1; r < s->nranks; r++) {
      smelt_session *p = s->peers[r - 1];
      smelt_cuda_buffer **buf = &s->dev_scratch[(size_t)(r - 1) * (size_t)g->noutputs + (size_t)slot];
      smelt_status st = NULL;
      if (*buf && bd->bytes > (size_t)s->scratch_bytes[slot]) {
        smelt_cuda_buffer_free(*buf);
        *buf = NULL;
      }
      if (!*buf) st = smelt_session_cuda_alloc(p, bd->bytes ? bd->bytes : 1, buf);
      if (!st) st = smelt_session_bind_output(p, name, smelt_cuda_buffer_data(*buf), bd->bytes);
      if (st) return st_prefix(st, "rank %d", r);
    }
    if (bd->bytes > s->scratch_bytes[slot]) s->scratch_bytes[slot] = bd->bytes;
    return NULL;
  }
  if (!input) {
    /* one buffer per output name, shared by the other ranks: they compute
     * the same whole output as rank 0, and nobody reads theirs */
    if (s->scratch_bytes[slot] < bd->bytes) {
      free(s->scratch[slot]);
      s->scratch_bytes[slot] = 0;
      if (!(s->scratch[slot] = rt_aligned_buffer(bd->bytes)))
        return st_error(ST_NO_MEMORY, "out of memory binding output '%s' on the other ranks", name);
      s->scratch_bytes[slot] = bd->bytes;
    }
    data = s->scratch[slot];
  }
  for (int r = 1; r < s->nranks; r++) {
    smelt_session *p = s->peers[r - 1];
    smelt_status st;
    if (!input) st = smelt_session_bind_output(p, name, (void *)data, bd->bytes);
    else if (bd->shaped) st = smelt_session_bind_input_shaped(p, name, data, bd->shape.rank, bd->shape.dim, bd->bytes);
    else st = smelt_session_bind_input(p, name, data, bd->bytes);
    if (st) return st_prefix(st, "rank %d", r);
  }
  return NULL;
}

typedef struct {
  smelt_session *s;
  RtStep what;
  int kernel;
  int iters, batch; /* timings */
  double *out;      /* rank 0's times */
} Step;

/* A timing on rank r: rank 0's into j->out, the others' thrown away. */
static smelt_status rank_time(const Step *j, smelt_session *x, int r) {
  size_t n = (size_t)j->iters * (j->what == RT_STEP_TIME_KERNELS ? (size_t)(x->b->nkernels ? x->b->nkernels : 1) : 1);
  double *out = r ? malloc(n * sizeof *out) : j->out;
  if (!out) return st_error(ST_NO_MEMORY, "out of memory");
  smelt_status st = j->what == RT_STEP_TIME_KERNELS ? rt_cuda_session_time_kernels(x, j->iters, out)
                                                    : rt_cuda_session_time_graph(x, j->iters, j->batch, out);
  if (r) free(out);
  return st;
}

static smelt_status rank_step(void *ctx, int r) {
  const Step *j = ctx;
  smelt_session *x = r ? j->s->peers[r - 1] : j->s;
  smelt_status st = NULL;
  switch (j->what) {
  case RT_STEP_RUN:
    /* CUDA ranks with NCCL: their graphs; else kernel by kernel */
    st = x->cuda && x->nccl ? rt_cuda_session_run(x) : rt_session_run_one(x);
    break;
  case RT_STEP_PREPARE: st = rt_session_prepare_one(x); break;
  case RT_STEP_KERNEL: st = rt_session_run_kernel_one(x, j->kernel); break;
  case RT_STEP_FINISH: st = rt_session_finish_one(x); break;
  case RT_STEP_ENQUEUE: st = x->nccl ? rt_cuda_session_enqueue(x) : rt_session_run_one(x); break;
  case RT_STEP_SYNC: st = x->nccl ? rt_cuda_session_synchronize(x) : NULL; break;
  case RT_STEP_TIME_KERNELS:
  case RT_STEP_TIME_GRAPH: st = rank_time(j, x, r); break;
  }
  if (st) rt_comm_fail(x->comm, r);
  return st && r ? st_prefix(st, "rank %d", r) : st;
}

smelt_status rt_ranks_step(smelt_session *s, RtStep what, int kernel) {
  Step j = {s, what, kernel, 0, 0, NULL};
  rt_comm_begin(s->comm);
  return rt_crew_run(s->crew, s->comm, rank_step, &j);
}

smelt_status rt_ranks_time(smelt_session *s, RtStep what, int iters, int batch, double *out) {
  if (!s->nccl)
    return st_error(ST_UNSUPPORTED, "%s: timing tensor-parallel ranks that share a GPU: their collectives go through "
                    "host memory, kernel by kernel (give each rank a GPU of its own)", fmt_file_path(s->root->file));
  Step j = {s, what, -1, iters, batch, out};
  rt_comm_begin(s->comm);
  return rt_crew_run(s->crew, s->comm, rank_step, &j);
}

int rt_ranks_state_axis(const smelt_session *s, int i) {
  if (s->nranks <= 1 || i < 0 || i >= s->nstates) return -1;
  const char *list = rt_bundle_manifest_get(s->root, "tp_states");
  const Graph *g = s->root->g;
  const char *name = g->val[g->states[i]].name;
  size_t n = strlen(name);
  /* "NAME:AXIS;NAME:AXIS" */
  for (const char *p = list; p && *p;) {
    const char *end = strchr(p, ';');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    const char *colon = NULL;
    for (const char *q = p; q < p + len; q++)
      if (*q == ':') colon = q;
    if (colon && (size_t)(colon - p) == n && strncmp(p, name, n) == 0) {
      long a = strtol(colon + 1, NULL, 10);
      return a >= 0 && a < g->val[g->states[i]].type.rank ? (int)a : -1;
    }
    p += len + (end ? 1 : 0);
  }
  return -1;
}

/* Rank x's part of state i to or from host memory part (its bytes). */
static smelt_status part_copy(smelt_session *x, int i, void *part, bool read) {
  size_t n = x->state_bytes[i];
  if (x->cuda)
    return read ? rt_cuda_download(x->dev, part, x->state_dev[i], n) : rt_cuda_upload(x->dev, x->state_dev[i], part, n);
  if (read) memcpy(part, x->state[i], n);
  else memcpy(x->state[i], part, n);
  return NULL;
}

smelt_status rt_ranks_state_copy(smelt_session *s, int i, void *data, bool read) {
  int a = rt_ranks_state_axis(s, i);
  if (a < 0) { /* whole on every rank: read rank 0's, write all */
    if (read) return part_copy(s, i, data, true);
    for (int r = 0; r < s->nranks; r++) RETURN_IF_ERROR(part_copy(r ? s->peers[r - 1] : s, i, data, false));
    return NULL;
  }
  /* rank r's part is block r of every row of the axes before a */
  size_t outer, block;
  ir_type_blocks(&s->root->g->val[s->root->g->states[i]].type, a, &outer, &block);
  char *tmp = s->cuda ? malloc(s->state_bytes[i] ? s->state_bytes[i] : 1) : NULL;
  if (s->cuda && !tmp) return st_error(ST_NO_MEMORY, "out of memory copying a state");
  smelt_status st = NULL;
  for (int r = 0; r < s->nranks && !st; r++) {
    smelt_session *x = r ? s->peers[r - 1] : s;
    char *part = tmp ? tmp : x->state[i];
    if (tmp && read) st = part_copy(x, i, tmp, true);
    for (size_t o = 0; o < outer && !st; o++) {
      char *whole = (char *)data + (o * (size_t)s->nranks + (size_t)r) * block;
      if (read) memcpy(whole, part + o * block, block);
      else memcpy(part + o * block, whole, block);
    }
    if (!st && tmp && !read) st = part_copy(x, i, tmp, false);
  }
  free(tmp);
  return st;
}

void rt_all_gather_blocks(const Graph *g, const Kernel *kn, size_t *outer, size_t *block) {
  const Node *n = &g->node[g->groups[kn->group].anchor];
  const TensorType *in = &g->val[kn->args[0]].type;
  ir_type_blocks(in, ir_norm_axis(ir_attr_int(n, "axis"), in->rank), outer, block);
}

smelt_status rt_ranks_collective(smelt_session *s, int i) {
  const Graph *g = s->b->g;
  const Kernel *kn = &s->b->kernels[i];
  const Node *n = &g->node[g->groups[kn->group].anchor];
  if (!s->comm || kn->nargs != 2)
    return st_error(ST_INTERNAL, "kernel '%s' (%s) runs across the ranks of a tensor-parallel session", kn->name,
                    ir_op_name(n->op));
  const TensorType *in = &g->val[kn->args[0]].type, *out = &g->val[kn->args[1]].type;
  if (s->cuda && s->nccl) { /* the launch queues it; then waited for */
    smelt_status st = rt_cuda_launch(s->dev, &s->r->cu->launches[i], 1);
    if (!st) st = rt_cuda_sync(s->dev);
    return st ? st_prefix(st, "kernel '%s'", kn->name) : NULL;
  }
  /* on the CPU, or CUDA ranks sharing a GPU: through host memory */
  void *const *argv = s->cuda ? NULL : s->r->argv + s->r->argv_at[i];
  void *host_in = NULL, *host_out = NULL;
  size_t in_bytes = ir_type_bytes(in), out_bytes = ir_type_bytes(out);
  smelt_status st = NULL;
  if (s->cuda) {
    const RtCudaPtr *dv = s->r->cu->argval + s->r->argv_at[i];
    host_in = malloc(in_bytes ? in_bytes : 1), host_out = malloc(out_bytes ? out_bytes : 1);
    if (!host_in || !host_out) st = st_error(ST_NO_MEMORY, "out of memory");
    if (!st) st = rt_cuda_download(s->dev, host_in, dv[0], in_bytes);
  }
  const void *src = argv ? argv[0] : host_in;
  void *dst = argv ? argv[1] : host_out;
  if (st) {
    rt_comm_fail(s->comm, s->rank); /* the others must not wait for this rank */
  } else if (n->op == OP_ALL_REDUCE) {
    st = rt_comm_all_reduce(s->comm, s->rank, src, dst, (size_t)ir_type_numel(out), out->dt);
  } else {
    /* a concatenation along axis a: the blocks are the rows of everything
     * before a, each this rank's part of the axis and all after it */
    size_t outer, block;
    rt_all_gather_blocks(g, kn, &outer, &block);
    st = rt_comm_all_gather(s->comm, s->rank, src, dst, outer, block);
  }
  if (!st && s->cuda) st = rt_cuda_upload(s->dev, s->r->cu->argval[s->r->argv_at[i] + 1], host_out, out_bytes);
  free(host_in);
  free(host_out);
  return st ? st_prefix(st, "kernel '%s'", kn->name) : NULL;
}
