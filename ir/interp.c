/* The reference interpreter: evaluates a graph node by node in plain C.
 *
 * ir_eval_node is the whole of the per-op machinery: it widens each typed
 * operand to a buffer of doubles (dt_load), calls the op's reference kernel
 * from a table generated from ops.def, and narrows the results back to their
 * storage dtypes (dt_store, which rounds f16/bf16 to nearest even once and
 * saturates integers).  Const-fold uses it directly.
 *
 * The Interp object owns one buffer per value, in the value's dtype.
 * Constants are copied in at creation, inputs by ir_interp_set_input, and a
 * run evaluates the live nodes in g->node order, which the graph keeps
 * topological.  A `ready` flag per value records what holds data, so that a
 * run with an input missing (or a graph whose order is broken) stops with a
 * status instead of reading garbage.  No memory is shared or reused between
 * values: the interpreter is the oracle, and simplicity beats footprint.
 */
#include <stdlib.h>
#include <string.h>

#include "interp.h"

/* The reference kernel of every op, in OP_ order. */
static const RefFn ref_table[OP_COUNT] = {
#define OP(id, name, mn, mx, nout, fc, attrs, infer, ref) [OP_##id] = ref,
#include "ops.def"
#undef OP
};

/* malloc that never returns NULL for a zero-sized tensor, so NULL always
 * means out of memory. */
static void *alloc_bytes(size_t n) { return malloc(n ? n : 1); }

static void free_buffers(double **bufs, int n) {
  if (!bufs) return;
  for (int i = 0; i < n; i++) free(bufs[i]);
  free(bufs);
}

smelt_status ir_eval_node(const Graph *g, const Node *n, const void *const *in, void *const *out) {
  RefFn fn = ref_table[n->op];
  int nin = n->nin, nout = n->nout;
  double **din = calloc((size_t)(nin ? nin : 1), sizeof *din);
  double **dout = calloc((size_t)(nout ? nout : 1), sizeof *dout);
  const TensorType **tin = calloc((size_t)(nin ? nin : 1), sizeof *tin);
  const TensorType **tout = calloc((size_t)(nout ? nout : 1), sizeof *tout);
  smelt_status st = NULL;
  if (!din || !dout || !tin || !tout) {
    st = st_error(ST_NO_MEMORY, "out of memory evaluating node '%s'", ir_node_name(g, n));
    goto done;
  }
  for (int i = 0; i < nin; i++) {
    const TensorType *t = &g->val[n->in[i]].type;
    size_t ne = (size_t)ir_type_numel(t);
    tin[i] = t;
    din[i] = alloc_bytes(ne * sizeof(double));
    if (!din[i]) {
      st = st_error(ST_NO_MEMORY, "out of memory evaluating node '%s'", ir_node_name(g, n));
      goto done;
    }
    for (size_t k = 0; k < ne; k++) din[i][k] = dt_load(t->dt, in[i], k);
  }
  for (int i = 0; i < nout; i++) {
    const TensorType *t = &g->val[n->out[i]].type;
    tout[i] = t;
    /* calloc: a kernel that skips an element leaves a 0, never garbage */
    dout[i] = calloc((size_t)ir_type_numel(t) + 1, sizeof(double));
    if (!dout[i]) {
      st = st_error(ST_NO_MEMORY, "out of memory evaluating node '%s'", ir_node_name(g, n));
      goto done;
    }
  }
  RefArgs args = {
      .g = g,
      .n = n,
      .nin = nin,
      .nout = nout,
      .in = (const double *const *)din,
      .in_type = tin,
      .out = dout,
      .out_type = tout,
  };
  st = fn(&args);
  if (!st)
    for (int i = 0; i < nout; i++) {
      size_t ne = (size_t)ir_type_numel(tout[i]);
      for (size_t k = 0; k < ne; k++) dt_store(tout[i]->dt, out[i], k, dout[i][k]);
    }
done:
  free_buffers(din, nin);
  free_buffers(dout, nout);
  free(tin);
  free(tout);
  return st;
}

struct Interp {
  const Graph *g;
  void **buf;  /* per value, in its dtype; NULL for values without a type */
  bool *ready; /* per value: buf holds its data */
};

smelt_status ir_interp_create(const Graph *g, Interp **out_interp) {
  *out_interp = NULL;
  Interp *it = calloc(1, sizeof *it);
  if (!it) return st_error(ST_NO_MEMORY, "out of memory creating the interpreter");
  it->g = g;
  it->buf = calloc((size_t)(g->nval ? g->nval : 1), sizeof *it->buf);
  it->ready = calloc((size_t)(g->nval ? g->nval : 1), sizeof *it->ready);
  if (!it->buf || !it->ready) goto oom;
  for (int v = 0; v < g->nval; v++) {
    const Value *val = &g->val[v];
    /* Results of dead nodes may never have been typed; they get no buffer
     * and a live node that reads one fails in run with a message. */
    if (val->type.dt == DT_INVALID) continue;
    size_t bytes = ir_type_bytes(&val->type);
    it->buf[v] = calloc(bytes ? bytes : 1, 1);
    if (!it->buf[v]) goto oom;
    if (val->kind == VK_CONST) {
      if (val->data && bytes) memcpy(it->buf[v], val->data, bytes);
      it->ready[v] = true;
    }
    if (val->kind == VK_INPUT && val->state) it->ready[v] = true; /* zero until set or updated */
  }
  *out_interp = it;
  return NULL;
oom:
  ir_interp_destroy(it);
  return st_error(ST_NO_MEMORY, "out of memory creating the interpreter");
}

void ir_interp_destroy(Interp *it) {
  if (!it) return;
  if (it->buf)
    for (int v = 0; v < it->g->nval; v++) free(it->buf[v]);
  free(it->buf);
  free(it->ready);
  free(it);
}

smelt_status ir_interp_set_input(Interp *it, int value, const void *data) {
  const Graph *g = it->g;
  if (value < 0 || value >= g->nval || g->val[value].kind != VK_INPUT || !it->buf[value])
    return st_error(ST_INVALID_INPUT, "value %d is not an input of graph '%s'", value,
                    g->name ? g->name : "");
  size_t bytes = ir_type_bytes(&g->val[value].type);
  if (bytes) memcpy(it->buf[value], data, bytes);
  it->ready[value] = true;
  return NULL;
}

/* Why a live node cannot run: the message names what is missing. */
static smelt_status missing_operand(const Graph *g, const Node *n, int v) {
  const Value *val = &g->val[v];
  if (val->kind == VK_INPUT)
    return st_at(val->loc, "input '%s' has no data (set it before running)", val->name);
  return st_at(n->loc, "node '%s' (%s): operand '%s' has not been computed before it", ir_node_name(g, n),
               ir_op_name(n->op), val->name);
}

/* Forgets the previous run's results, so a broken order cannot read them. */
static void run_begin(Interp *it) {
  const Graph *g = it->g;
  for (int v = 0; v < g->nval; v++)
    if (g->val[v].kind == VK_NODE) it->ready[v] = false;
}

/* Node i of it's graph on its ready operands. */
static smelt_status run_node(Interp *it, int i) {
  const Graph *g = it->g;
  const Node *n = &g->node[i];
  if (n->dead) return NULL;
  const void *in_stack[16];
  void *out_stack[16];
  /* Small operand lists (all but a long concat or split) avoid malloc. */
  const void **in = n->nin <= 16 ? in_stack : malloc((size_t)n->nin * sizeof *in);
  void **out = n->nout <= 16 ? out_stack : malloc((size_t)n->nout * sizeof *out);
  smelt_status st = NULL;
  if (!in || !out) st = st_error(ST_NO_MEMORY, "out of memory running node '%s'", ir_node_name(g, n));
  for (int k = 0; !st && k < n->nin; k++) {
    if (!it->ready[n->in[k]]) st = missing_operand(g, n, n->in[k]);
    else in[k] = it->buf[n->in[k]];
  }
  for (int k = 0; !st && k < n->nout; k++) {
    out[k] = it->buf[n->out[k]];
    if (!out[k])
      st = st_at(n->loc, "node '%s' (%s): result '%s' has no type", ir_node_name(g, n), ir_op_name(n->op),
                 g->val[n->out[k]].name);
  }
  if (!st) st = ir_eval_node(g, n, (const void *const *)in, (void *const *)out);
  if (in != in_stack) free(in);
  if (out != out_stack) free(out);
  if (st) return st;
  for (int k = 0; k < n->nout; k++) it->ready[n->out[k]] = true;
  return NULL;
}

/* State persists: the next run reads what this one wrote. */
static void run_end(Interp *it) {
  const Graph *g = it->g;
  for (int i = 0; i < g->nstates; i++) {
    int v = g->states[i], up = ir_state_update(g, v);
    if (up >= 0 && it->buf[v]) memcpy(it->buf[v], it->buf[g->node[up].out[0]], ir_type_bytes(&g->val[v].type));
  }
}

smelt_status ir_interp_run(Interp *it) {
  run_begin(it);
  for (int i = 0; i < it->g->nnode; i++) RETURN_IF_ERROR(run_node(it, i));
  run_end(it);
  return NULL;
}

/* Collective node i across the ranks, in double: all_reduce sums the
 * ranks' x in rank order into every rank's result, all_gather copies rank
 * r's x into block r along the axis of every rank's result. */
static smelt_status run_collective(Interp *const *its, int nranks, int i) {
  const Graph *g0 = its[0]->g;
  const Node *n0 = &g0->node[i];
  for (int r = 0; r < nranks; r++) {
    const Node *n = &its[r]->g->node[i];
    if (!its[r]->ready[n->in[0]]) return missing_operand(its[r]->g, n, n->in[0]);
    if (ir_attr_int(n, "ranks") != nranks)
      return st_at(n->loc, "node '%s' (%s) is over %lld ranks, the reference runs %d", ir_node_name(its[r]->g, n),
                   ir_op_name(n->op), (long long)ir_attr_int(n, "ranks"), nranks);
  }
  const TensorType *xt = &g0->val[n0->in[0]].type;
  size_t count = (size_t)ir_type_numel(xt);
  if (n0->op == OP_ALL_REDUCE) {
    for (size_t e = 0; e < count; e++) {
      double sum = 0;
      for (int r = 0; r < nranks; r++) sum += dt_load(xt->dt, its[r]->buf[its[r]->g->node[i].in[0]], e);
      for (int r = 0; r < nranks; r++) dt_store(xt->dt, its[r]->buf[its[r]->g->node[i].out[0]], e, sum);
    }
  } else {
    size_t outer, block;
    ir_type_blocks(xt, ir_norm_axis(ir_attr_int(n0, "axis"), xt->rank), &outer, &block);
    for (int r = 0; r < nranks; r++)
      for (int q = 0; q < nranks; q++)
        for (size_t o = 0; o < outer; o++)
          memcpy((char *)its[r]->buf[its[r]->g->node[i].out[0]] + (o * (size_t)nranks + (size_t)q) * block,
                 (const char *)its[q]->buf[its[q]->g->node[i].in[0]] + o * block, block);
  }
  for (int r = 0; r < nranks; r++) its[r]->ready[its[r]->g->node[i].out[0]] = true;
  return NULL;
}

smelt_status ir_interp_run_ranks(Interp *const *its, int nranks) {
  const Graph *g0 = its[0]->g;
  for (int r = 1; r < nranks; r++) {
    const Graph *g = its[r]->g;
    bool same = g->nnode == g0->nnode;
    for (int i = 0; same && i < g->nnode; i++)
      same = g->node[i].op == g0->node[i].op && g->node[i].dead == g0->node[i].dead &&
             (!ir_op_is_collective(g->node[i].op) ||
              ir_type_equal(&g->val[g->node[i].in[0]].type, &g0->val[g0->node[i].in[0]].type));
    if (!same)
      return st_error(ST_INVALID_INPUT, "the graphs of rank 0 and rank %d are not one model's parts (their nodes "
                      "differ)", r);
  }
  for (int r = 0; r < nranks; r++) run_begin(its[r]);
  for (int i = 0; i < g0->nnode; i++) {
    if (!g0->node[i].dead && ir_op_is_collective(g0->node[i].op)) {
      RETURN_IF_ERROR(run_collective(its, nranks, i));
      continue;
    }
    for (int r = 0; r < nranks; r++) {
      smelt_status st = run_node(its[r], i);
      if (st) return r ? st_prefix(st, "rank %d", r) : st;
    }
  }
  for (int r = 0; r < nranks; r++) run_end(its[r]);
  return NULL;
}

const void *ir_interp_value(const Interp *it, int value) {
  if (value < 0 || value >= it->g->nval || !it->ready[value]) return NULL;
  return it->buf[value];
}
