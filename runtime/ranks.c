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

smelt_status rt_ranks_session_create(smelt_bundle *b, int threads, const smelt_session_options *options,
                                     smelt_session **out_session) {
  *out_session = NULL;
  int n = b->nranks;
  /* the threads split between the ranks, at least one each (each rank's
   * own thread is the first of its pool) */
  int per = threads / n > 0 ? threads / n : 1;
  smelt_session *s = NULL;
  RETURN_IF_ERROR(rt_session_create_one(b, false, 0, per, options, &s));
  smelt_status st = NULL;
  s->nranks = n;
  if (!(s->peers = calloc((size_t)n, sizeof *s->peers)) ||
      !(s->scratch = calloc((size_t)(b->g->noutputs + 1), sizeof *s->scratch)) ||
      !(s->scratch_bytes = calloc((size_t)(b->g->noutputs + 1), sizeof *s->scratch_bytes)))
    st = st_error(ST_NO_MEMORY, "out of memory creating a session");
  if (!st) st = rt_comm_create(n, &s->comm);
  if (!st) st = rt_crew_create(n, &s->crew);
  for (int r = 1; r < n && !st; r++) {
    st = rt_session_create_one(b->ranks[r], false, 0, per, options, &s->peers[r - 1]);
    if (st) st = st_prefix(st, "rank %d", r);
    else s->peers[r - 1]->comm = s->comm, s->peers[r - 1]->nranks = n;
  }
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
    return;
  }
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
  if (!input) {
    /* one buffer per output name, shared by the other ranks: they compute
     * the same whole output as rank 0, and nobody reads theirs */
    const Graph *g = s->b->g;
    int slot = -1;
    for (int i = 0; i < g->noutputs && slot < 0; i++)
      if (strcmp(g->val[g->outputs[i]].name, name) == 0) slot = i;
    if (slot < 0) return st_error(ST_INTERNAL, "output '%s' bound on rank 0 only", name);
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
} Step;

static smelt_status rank_step(void *ctx, int r) {
  const Step *j = ctx;
  smelt_session *x = r ? j->s->peers[r - 1] : j->s;
  smelt_status st = NULL;
  switch (j->what) {
  case RT_STEP_RUN: st = rt_session_run_one(x); break;
  case RT_STEP_PREPARE: st = rt_session_prepare_one(x); break;
  case RT_STEP_KERNEL: st = rt_session_run_kernel_one(x, j->kernel); break;
  case RT_STEP_FINISH: st = rt_session_finish_one(x); break;
  }
  if (st) rt_comm_fail(x->comm, r);
  return st && r ? st_prefix(st, "rank %d", r) : st;
}

smelt_status rt_ranks_step(smelt_session *s, RtStep what, int kernel) {
  Step j = {s, what, kernel};
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

smelt_status rt_ranks_state_copy(smelt_session *s, int i, void *data, bool read) {
  int a = rt_ranks_state_axis(s, i);
  if (a < 0) { /* whole on every rank: read rank 0's, write all */
    if (read) {
      memcpy(data, s->state[i], s->state_bytes[i]);
      return NULL;
    }
    for (int r = 0; r < s->nranks; r++) memcpy(r ? s->peers[r - 1]->state[i] : s->state[i], data, s->state_bytes[i]);
    return NULL;
  }
  /* rank r's part is block r of every row of the axes before a */
  size_t outer, block;
  ir_type_blocks(&s->root->g->val[s->root->g->states[i]].type, a, &outer, &block);
  for (int r = 0; r < s->nranks; r++) {
    char *part = r ? s->peers[r - 1]->state[i] : s->state[i];
    for (size_t o = 0; o < outer; o++) {
      char *whole = (char *)data + (o * (size_t)s->nranks + (size_t)r) * block;
      if (read) memcpy(whole, part + o * block, block);
      else memcpy(part + o * block, whole, block);
    }
  }
  return NULL;
}

smelt_status rt_ranks_collective(smelt_session *s, int i) {
  const Graph *g = s->b->g;
  const Kernel *kn = &s->b->kernels[i];
  const Node *n = &g->node[g->groups[kn->group].anchor];
  if (!s->comm || kn->nargs != 2)
    return st_error(ST_INTERNAL, "kernel '%s' (%s) runs across the ranks of a tensor-parallel session", kn->name,
                    ir_op_name(n->op));
  void *const *argv = s->r->argv + s->r->argv_at[i];
  const TensorType *in = &g->val[kn->args[0]].type, *out = &g->val[kn->args[1]].type;
  smelt_status st;
  if (n->op == OP_ALL_REDUCE) {
    st = rt_comm_all_reduce(s->comm, s->rank, argv[0], argv[1], (size_t)ir_type_numel(out), out->dt);
  } else {
    /* a concatenation along axis a: the blocks are the rows of everything
     * before a, each this rank's part of the axis and all after it */
    size_t outer, block;
    ir_type_blocks(in, ir_norm_axis(ir_attr_int(n, "axis"), in->rank), &outer, &block);
    st = rt_comm_all_gather(s->comm, s->rank, argv[0], argv[1], outer, block);
  }
  return st ? st_prefix(st, "kernel '%s'", kn->name) : NULL;
}
