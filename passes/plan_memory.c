/* plan-memory: one arena for the tensors that live between kernels, with
 * space reused between tensors whose lifetimes do not overlap.
 *
 * Kernels run in the order of g->node, one step per fusion group (groups are
 * contiguous there; a node outside any group, as when `fuse` did not run, is
 * a step of its own).  The tensors planned are the intermediates: results
 * that a step other than their producer's reads, except graph outputs (they
 * go to the caller's buffers); inputs and constants are not results.  A
 * value used only inside its own group never reaches memory.  The lifetime
 * of an intermediate is [producing step, last reading step].
 *
 * Placement is TFLite's greedy-by-size (FIELD-NOTES.md): buffers sorted
 * largest first (ties: earlier first step, then value id, so the plan does
 * not depend on anything but the graph); each goes to the lowest 64-byte
 * aligned offset where it overlaps no already placed buffer whose lifetime
 * overlaps its own.  The arena's size is the high-water mark.
 *
 * In place: an elementwise group without injective members (reshape,
 * transpose, rope, expand, ... read elements at other positions) computes
 * output element i from element i of each input of the output's shape.  So
 * when one of its inputs is an intermediate whose last reader is this group
 * and that has the output's shape and element size, the output may take the
 * input's space: the kernel reads each element before it writes it.  The two
 * become one buffer whose lifetime is the union of theirs, placed as one.
 * Such an input and output share an arena offset, which is how a code
 * generator recognises the pair (it must not tell the compiler that those
 * two arguments do not alias).
 *
 * Sets Value.mem_offset (-1 for values not in the arena), g->arena_bytes and
 * g->unplanned_bytes (the sum of the intermediates' sizes without sharing).
 *
 * Requires: topological order; contiguous groups (fuse) or none.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

#define ARENA_ALIGN 64

typedef struct {
  int v;            /* the value */
  int64_t bytes;
  int first, last;  /* lifetime in steps */
  int root;         /* buffer it shares (in place), itself if none */
  int64_t off;
} Tensor;

static int64_t align_up(int64_t x) { return (x + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN; }

/* Reads elements only at the positions it writes (see above). */
static bool positionwise(const Node *n) {
  FusionClass fc = ir_op_info(n->op)->fclass;
  return n->nout == 1 && (fc == FC_ELEMWISE || fc == FC_BROADCAST) && n->op != OP_EXPAND && n->op != OP_BATCH_NORM;
}

/* step[n] for every node; *out_nsteps; inplace_ok[s] whether step s is an
 * elementwise kernel that may write over an input. */
static smelt_status number_steps(const Graph *g, int *step, bool *inplace_ok, int *out_nsteps) {
  int *group_step = malloc(sizeof(int) * ((size_t)g->ngroups + 1));
  if (!group_step) return st_error(ST_NO_MEMORY, "out of memory");
  for (int k = 0; k < g->ngroups; k++) group_step[k] = -1;
  int s = -1, prev_group = -1;
  smelt_status st = NULL;
  for (int i = 0; i < g->nnode && !st; i++) {
    const Node *n = &g->node[i];
    if (n->dead) {
      step[i] = -1;
      continue;
    }
    int k = n->group >= 0 && n->group < g->ngroups ? n->group : -1;
    if (k < 0) { /* not fused: a kernel of its own */
      step[i] = ++s;
      inplace_ok[s] = positionwise(n);
      prev_group = -1;
      continue;
    }
    if (k != prev_group) {
      if (group_step[k] >= 0) {
        st = st_error(ST_INTERNAL, "internal error: the nodes of group %s are not contiguous",
                      g->groups[k].kernel ? g->groups[k].kernel : "?");
        break;
      }
      group_step[k] = ++s;
      inplace_ok[s] = g->groups[k].kind == GK_ELEMWISE;
      prev_group = k;
    }
    step[i] = s;
    if (!positionwise(n)) inplace_ok[s] = false;
  }
  free(group_step);
  *out_nsteps = s + 1;
  return st;
}

static int find_root(Tensor *t, int i) {
  while (t[i].root != i) i = t[i].root;
  return i;
}

static int cmp_by_size(const void *a, const void *b) {
  const Tensor *x = a, *y = b;
  if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
  if (x->first != y->first) return x->first < y->first ? -1 : 1;
  return (x->v > y->v) - (x->v < y->v);
}

static int cmp_by_offset(const void *a, const void *b) {
  const Tensor *x = *(Tensor *const *)a, *y = *(Tensor *const *)b;
  return (x->off > y->off) - (x->off < y->off);
}

/* Greedy by size over buffers b[0..n) (sorted); returns the high-water mark. */
static int64_t place(Tensor *b, int n, Tensor **scratch) {
  int64_t high = 0;
  for (int i = 0; i < n; i++) {
    int nc = 0;
    for (int j = 0; j < i; j++)
      if (b[j].first <= b[i].last && b[i].first <= b[j].last) scratch[nc++] = &b[j];
    qsort(scratch, (size_t)nc, sizeof *scratch, cmp_by_offset);
    int64_t off = 0;
    for (int j = 0; j < nc; j++) {
      if (off + b[i].bytes <= scratch[j]->off) break; /* fits in the gap below it */
      int64_t end = align_up(scratch[j]->off + scratch[j]->bytes);
      if (end > off) off = end;
    }
    b[i].off = off;
    if (off + b[i].bytes > high) high = off + b[i].bytes;
  }
  return high;
}

/* "kernel k03_x" or, outside groups, "x (exp)": what runs as step s. */
static void step_name(const Graph *g, const int *step, int s, char *buf, size_t cap) {
  snprintf(buf, cap, "?");
  for (int i = 0; i < g->nnode; i++)
    if (step[i] == s) {
      const Node *n = &g->node[i];
      if (n->group >= 0 && n->group < g->ngroups && g->groups[n->group].kernel)
        snprintf(buf, cap, "kernel %s", g->groups[n->group].kernel);
      else
        snprintf(buf, cap, "%s (%s)", ir_node_name(g, n), ir_op_name(n->op));
      return;
    }
}

smelt_status pass_plan_memory(Graph *g, PassCtx *ctx, bool *changed) {
  *changed = false;
  size_t N = (size_t)g->nnode + 1, V = (size_t)g->nval + 1;
  int *step = malloc(sizeof(int) * N), *tix = malloc(sizeof(int) * V);
  bool *inplace_ok = calloc(N, sizeof(bool)), *is_out = calloc(V, sizeof(bool));
  int64_t *old_off = malloc(sizeof(int64_t) * V);
  Tensor *t = malloc(sizeof(Tensor) * V), *buf = malloc(sizeof(Tensor) * V);
  Tensor **scratch = malloc(sizeof(Tensor *) * V);
  smelt_status st = NULL;
  if (!step || !tix || !inplace_ok || !is_out || !old_off || !t || !buf || !scratch) {
    st = st_error(ST_NO_MEMORY, "out of memory");
    goto done;
  }
  int nsteps = 0;
  st = number_steps(g, step, inplace_ok, &nsteps);
  if (st) goto done;
  for (int i = 0; i < g->noutputs; i++) is_out[g->outputs[i]] = true;
  /* An elementwise kernel whose results have different shapes (siblings
   * merged by fuse: one grid-stride loop per shape) may read an input in
   * one loop after another loop wrote it, on another thread: no writing
   * in place there. */
  {
    int64_t *shape_of = calloc(N, sizeof(int64_t)); /* per step: index of a result value + 1 */
    if (!shape_of) {
      st = st_error(ST_NO_MEMORY, "out of memory");
      goto done;
    }
    /* the results of each step: values read by another step, and graph outputs */
    for (int i = 0; i <= g->nnode; i++) {
      const Node *n = i < g->nnode ? &g->node[i] : NULL;
      if (n && step[i] < 0) continue;
      int nv = n ? n->nin : g->noutputs;
      for (int j = 0; j < nv; j++) {
        int v = n ? n->in[j] : g->outputs[j];
        const Value *val = &g->val[v];
        if (val->kind != VK_NODE || step[val->node] < 0 || (n && step[val->node] == step[i])) continue;
        int s = step[val->node];
        if (!shape_of[s]) shape_of[s] = v + 1;
        else {
          const TensorType *a = &g->val[shape_of[s] - 1].type, *b = &val->type;
          if (a->rank != b->rank || memcmp(a->dim, b->dim, sizeof(int64_t) * (size_t)a->rank) != 0)
            inplace_ok[s] = false;
        }
      }
    }
    free(shape_of);
  }

  /* lifetimes: last[v] over the readers of v in other steps */
  int *last = tix; /* first used for last steps, then for tensor indices */
  for (int v = 0; v < g->nval; v++) last[v] = -1;
  for (int i = 0; i < g->nnode; i++) {
    if (step[i] < 0) continue;
    const Node *n = &g->node[i];
    for (int j = 0; j < n->nin; j++) {
      int v = n->in[j];
      if (g->val[v].kind != VK_NODE || step[g->val[v].node] == step[i]) continue;
      if (step[i] > last[v]) last[v] = step[i];
    }
  }
  int nt = 0;
  int64_t unplanned = 0;
  for (int v = 0; v < g->nval; v++) {
    old_off[v] = g->val[v].mem_offset;
    g->val[v].mem_offset = -1;
    int lv = last[v];
    tix[v] = -1;
    /* the result of a scatter that updates a state lives in the state */
    if (lv < 0 || is_out[v] || ir_state_of(g, v) >= 0) continue;
    Tensor *x = &t[nt];
    x->v = v;
    x->bytes = (int64_t)ir_type_bytes(&g->val[v].type);
    x->first = step[g->val[v].node];
    x->last = lv;
    x->root = nt;
    x->off = 0;
    tix[v] = nt++;
    unplanned += x->bytes;
  }

  /* in place: the output of an elementwise step over an input that dies there */
  int ninplace = 0;
  for (int i = 0; i < nt; i++) {
    Tensor *out = &t[i];
    int s = out->first;
    if (!inplace_ok[s]) continue;
    const TensorType *ot = &g->val[out->v].type;
    int taken = -1;
    /* a step's nodes are contiguous and start where its result's producer's do */
    int n0 = g->val[out->v].node;
    while (n0 > 0 && step[n0 - 1] == s) n0--;
    for (int n = n0; n < g->nnode && step[n] == s && taken < 0; n++) {
      for (int j = 0; j < g->node[n].nin && taken < 0; j++) {
        int in = tix[g->node[n].in[j]];
        if (in < 0 || t[in].last != s || t[in].first == s) continue;
        const TensorType *it = &g->val[t[in].v].type;
        if (dt_size(it->dt) != dt_size(ot->dt) || it->rank != ot->rank) continue;
        if (memcmp(it->dim, ot->dim, sizeof(int64_t) * (size_t)ot->rank) != 0) continue;
        int r = find_root(t, in);
        if (r == find_root(t, i)) continue;
        /* only one output may take a dying buffer: its end is this step */
        bool free_here = true;
        for (int k = 0; k < nt && free_here; k++)
          if (find_root(t, k) == r && (t[k].last > s || t[k].first == s)) free_here = false;
        if (free_here) taken = in;
      }
    }
    if (taken < 0) continue;
    out->root = find_root(t, taken);
    ninplace++;
    char who[256];
    step_name(g, step, s, who, sizeof who);
    pass_ctx_logf(ctx, "plan-memory: %s is written in place over %s, which %s reads last", g->val[out->v].name,
                  g->val[t[taken].v].name, who);
  }

  /* buffers: one per root, lifetime the union of its tensors' */
  int nb = 0;
  for (int i = 0; i < nt; i++) {
    if (find_root(t, i) != i) continue;
    buf[nb] = t[i];
    buf[nb].root = i; /* the tensor that names the buffer */
    for (int k = 0; k < nt; k++)
      if (k != i && find_root(t, k) == i) {
        if (t[k].first < buf[nb].first) buf[nb].first = t[k].first;
        if (t[k].last > buf[nb].last) buf[nb].last = t[k].last;
      }
    nb++;
  }
  qsort(buf, (size_t)nb, sizeof *buf, cmp_by_size);
  int64_t arena = place(buf, nb, scratch);
  for (int b = 0; b < nb; b++) t[buf[b].root].off = buf[b].off;
  for (int i = 0; i < nt; i++) g->val[t[i].v].mem_offset = t[find_root(t, i)].off;

  for (int v = 0; v < g->nval; v++)
    if (g->val[v].mem_offset != old_off[v]) *changed = true;
  if (g->arena_bytes != arena || g->unplanned_bytes != unplanned) *changed = true;
  g->arena_bytes = arena;
  g->unplanned_bytes = unplanned;
  if (unplanned > 0)
    pass_ctx_logf(ctx,
                  "plan-memory: %d intermediates between %d kernels, %lld B without sharing, arena %lld B (%.1f%%), "
                  "%d written in place",
                  nt, nsteps, (long long)unplanned, (long long)arena, 100.0 * (double)arena / (double)unplanned,
                  ninplace);
  else
    pass_ctx_logf(ctx, "plan-memory: no intermediates between %d kernel%s; no arena", nsteps, nsteps == 1 ? "" : "s");

done:
  free(step), free(tix), free(inplace_ok), free(is_out), free(old_off), free(t), free(buf), free(scratch);
  return st;
}
