/* Kernel lowering: fusion groups become Kernels.
 *
 * A group's arguments follow from one scan of the graph: a value read by a
 * member but produced elsewhere (graph input, constant, another group's
 * result) is an input; a member's result is an output when a node of
 * another group reads it or it is a graph output.  Results used only inside
 * the group never reach memory: that is the point of fusing.
 *
 * Kernels are ordered by the position of their first member in g->node; the
 * fuse pass keeps groups contiguous and topologically ordered there, so this
 * is an order in which every kernel's inputs exist before it runs.
 *
 * The number of tasks of a kernel is fixed here, target-independently, from
 * the shape of the work (see lower.h); the backends generate code that
 * iterates exactly this space, so a runtime can split [0, ntasks) among
 * threads without knowing what a task is.
 */
#include "codegen/lower.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Longest last dim that stays one task; longer rows are cut into chunks of
 * this many elements (32 KiB of f32: big enough to amortise a task, small
 * enough that one long vector still spreads over the threads). */
#define CG_CHUNK 8192

void cg_elemwise_space(const TensorType *t, CgSpace *out) {
  int64_t rows = 1, inner = t->rank ? t->dim[t->rank - 1] : 1;
  for (int i = 0; i + 1 < t->rank; i++) rows *= t->dim[i];
  out->rows = rows;
  out->inner = inner;
  out->chunk = inner > CG_CHUNK ? CG_CHUNK : inner;
  out->nchunks = inner > CG_CHUNK ? (inner + CG_CHUNK - 1) / CG_CHUNK : 1;
  /* a ranged last axis: a task per element, so that a run at a smaller
   * value runs exactly its elements (codegen/ranges.c) */
  if (t->rank && t->dyn[t->rank - 1]) out->chunk = 1, out->nchunks = inner;
  if (inner == 0) out->chunk = out->nchunks = 0;
}

bool cg_reduced_axes(const Graph *g, const Node *n, bool red[IR_MAX_RANK]) {
  const TensorType *t = &g->val[n->in[0]].type;
  for (int i = 0; i < IR_MAX_RANK; i++) red[i] = false;
  switch (n->op) {
  case OP_SUM: case OP_MEAN: case OP_MAX: case OP_MIN: {
    const Attr *ax = ir_attr(n, "axes");
    for (int i = 0; i < t->rank; i++) red[i] = ax == NULL;
    if (ax)
      for (int k = 0; k < ax->n; k++) {
        int d = ir_norm_axis(ax->ints[k], t->rank);
        if (d >= 0) red[d] = true;
      }
    return true;
  }
  case OP_SOFTMAX: case OP_LOG_SOFTMAX: case OP_LAYER_NORM: case OP_RMS_NORM: {
    int d = ir_norm_axis(ir_attr_int(n, "axis"), t->rank);
    if (d < 0) return false;
    red[d] = true;
    return true;
  }
  case OP_GLOBAL_AVG_POOL:
    for (int i = 2; i < t->rank; i++) red[i] = true;
    return true;
  default: return false;
  }
}

/* Whether node n of group gr is an rms_norm that the group's matmul
 * computes in its loads (fuse: a decode GEMV's norm prologue, CUDA only):
 * part of the operand, not a second anchor. */
static bool norm_prologue(const Graph *g, const Group *gr, const Node *n) {
  if (n->op != OP_RMS_NORM || gr->anchor < 0) return false;
  const Node *a = &g->node[gr->anchor];
  return a != n && a->op == OP_MATMUL && a->in[0] == n->out[0];
}

int cg_group_anchor(const Graph *g, const Group *gr, int *out_count) {
  int anchor = -1, count = 0;
  for (int i = 0; i < gr->nnodes; i++) {
    const Node *n = &g->node[gr->nodes[i]];
    if (ir_op_info(n->op)->fclass < FC_REDUCTION || norm_prologue(g, gr, n)) continue;
    if (anchor < 0 || gr->nodes[i] == gr->anchor) anchor = gr->nodes[i];
    count++;
  }
  if (out_count) *out_count = count;
  return anchor;
}

void cg_matmul_space(const Graph *g, const Node *n, int64_t *out_rows, int64_t *out_col_blocks) {
  const TensorType *y = &g->val[n->out[0]].type;
  /* every output dim but the last is a row; a 1-D right operand leaves
   * no column dim, so then every output element is a row */
  bool b1 = g->val[n->in[1]].type.rank == 1;
  int64_t rows = 1;
  for (int i = 0; i < y->rank - (b1 ? 0 : 1); i++) rows *= y->dim[i];
  int64_t cols = b1 ? 1 : y->dim[y->rank - 1];
  *out_rows = rows;
  /* few rows (decoding): the columns are split too, so that one row's
   * weight reads spread over the threads */
  *out_col_blocks = rows < CG_MM_SPLIT_ROWS && cols > CG_MM_COLS ? (cols + CG_MM_COLS - 1) / CG_MM_COLS : 1;
}

int64_t cg_kernel_tasks(const Graph *g, int anchor, const TensorType *first_out) {
  if (anchor < 0) {
    if (!first_out) return 0;
    CgSpace s;
    cg_elemwise_space(first_out, &s);
    return s.rows * s.nchunks;
  }
  const Node *n = &g->node[anchor];
  const TensorType *x = &g->val[n->in[0]].type, *y = &g->val[n->out[0]].type;
  bool red[IR_MAX_RANK];
  if (cg_reduced_axes(g, n, red)) {
    int64_t rows = 1;
    for (int i = 0; i < x->rank; i++)
      if (!red[i]) rows *= x->dim[i];
    return rows;
  }
  switch (n->op) {
  case OP_MATMUL: {
    int64_t rows, ncb;
    cg_matmul_space(g, n, &rows, &ncb);
    return rows * ncb;
  }
  case OP_CONV2D:
  case OP_MAX_POOL2D:
  case OP_AVG_POOL2D: return y->dim[0] * y->dim[1] * y->dim[2];
  case OP_ATTENTION: return y->dim[0] * y->dim[1] * y->dim[2];
  case OP_TOPK: { /* its rows: every combination of the other axes */
    int ax = ir_norm_axis(ir_attr_int(n, "axis"), x->rank);
    return ax < 0 || x->dim[ax] == 0 ? 1 : ir_type_numel(x) / x->dim[ax];
  }
  default: return 1;
  }
}

/* ---- names ---- */

static void sanitise(char *s) {
  for (; *s; s++) {
    char c = *s;
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.';
    if (!ok) *s = '_';
  }
}

/* Length of the block prefix ("layer.3/") of name: up to its last '/'. */
static size_t prefix_len(const char *name) {
  const char *slash = strrchr(name, '/');
  return slash ? (size_t)(slash - name) + 1 : 0;
}

char *cg_kernel_name(const Graph *g, int group, char *buf, size_t cap) {
  const Group *gr = &g->groups[group];
  int len = snprintf(buf, cap, "k%02d", group);
  if (len < 0 || (size_t)len >= cap) return buf;
  if (gr->kernel && gr->kernel[0]) {
    /* the fuse pass's name already carries its own index */
    snprintf(buf, cap, "%s", gr->kernel);
    sanitise(buf);
    return buf;
  }
  const char *first = NULL;
  size_t first_pre = 0;
  for (int i = 0; i < gr->nnodes; i++) {
    const char *name = ir_node_name(g, &g->node[gr->nodes[i]]);
    const char *part = name;
    if (!first) {
      first = name;
      first_pre = prefix_len(name);
    } else if (first_pre && strncmp(name, first, first_pre) == 0) {
      part = name + first_pre; /* the block prefix is written once */
    }
    size_t plen = strlen(part);
    /* whole parts only: a name cut in the middle reads as another name */
    if ((size_t)len + 1 + plen >= cap) break;
    buf[len++] = '_';
    memcpy(buf + len, part, plen + 1);
    len += (int)plen;
  }
  sanitise(buf);
  return buf;
}

/* ---- lowering ---- */

/* Group of the node that produces v, or -1 (inputs, constants). */
static int producer_group(const Graph *g, int v) {
  return g->val[v].kind == VK_NODE ? g->node[g->val[v].node].group : -1;
}

static bool in_list(const int *list, int n, int v) {
  for (int i = 0; i < n; i++)
    if (list[i] == v) return true;
  return false;
}

/* Estimated floating-point operations of one node: a contraction counts a
 * multiply and an add per term, an elementwise op one per element, a
 * reduction or norm a few per input element; data movement none. */
static double node_flops(const Graph *g, const Node *n) {
  const TensorType *x = &g->val[n->in[0]].type, *y = &g->val[n->out[0]].type;
  double out = (double)ir_type_numel(y), in = (double)ir_type_numel(x);
  switch (ir_op_info(n->op)->fclass) {
  case FC_ELEMWISE:
  case FC_BROADCAST: return n->op == OP_CAST || n->op == OP_EXPAND ? 0 : out;
  case FC_INJECTIVE: return n->op == OP_ROPE ? 3 * out : 0;
  case FC_REDUCTION:
    if (n->op == OP_MAX_POOL2D || n->op == OP_AVG_POOL2D) {
      const Attr *k = ir_attr(n, "kernel");
      return out * (double)(k && k->n == 2 ? k->ints[0] * k->ints[1] : 1);
    }
    return in * (n->op == OP_SUM || n->op == OP_MEAN || n->op == OP_MAX || n->op == OP_MIN ? 1 : 4);
  case FC_CONTRACTION:
    if (n->op == OP_MATMUL) {
      const TensorType *a = &g->val[n->in[0]].type;
      bool ta = ir_attr_int(n, "transpose_a") != 0;
      int64_t k = a->rank == 1 ? a->dim[0] : a->dim[ta ? a->rank - 2 : a->rank - 1];
      return 2 * out * (double)k;
    } else {
      const TensorType *w = &g->val[n->in[1]].type;
      return 2 * out * (double)(w->dim[1] * w->dim[2] * w->dim[3]);
    }
  case FC_OPAQUE: {
    if (n->op != OP_ATTENTION) return 0; /* scatter, argmax, topk, arange: data movement */
    /* attention: q.k and p.v per (query, key) pair */
    const TensorType *k = &g->val[n->in[1]].type;
    double pairs = (double)(x->dim[0] * x->dim[1] * x->dim[2] * k->dim[2]);
    if (ir_attr_int(n, "causal")) pairs /= 2;
    return pairs * 2 * (double)(x->dim[3] + y->dim[3]);
  }
  }
  return 0;
}

/* Lowers group gi into k; used_outside[v] says whether value v is read by a
 * node of another group or is a graph output. */
static smelt_status lower_group(const Graph *g, int gi, const bool *used_outside, Kernel *k) {
  const Group *gr = &g->groups[gi];
  int cap = 0;
  for (int i = 0; i < gr->nnodes; i++) {
    const Node *n = &g->node[gr->nodes[i]];
    cap += n->nin + n->nout;
  }
  int *args = malloc(sizeof(int) * (size_t)(cap ? cap : 1));
  if (!args) return st_error(ST_NO_MEMORY, "out of memory lowering kernels");
  int nargs = 0;
  double flops = 0;
  for (int i = 0; i < gr->nnodes; i++) {
    const Node *n = &g->node[gr->nodes[i]];
    for (int j = 0; j < n->nin; j++) {
      int v = n->in[j];
      if (producer_group(g, v) != gi && !in_list(args, nargs, v)) args[nargs++] = v;
    }
    flops += node_flops(g, n);
  }
  int nin = nargs;
  for (int i = 0; i < gr->nnodes; i++) {
    const Node *n = &g->node[gr->nodes[i]];
    for (int j = 0; j < n->nout; j++)
      if (used_outside[n->out[j]]) args[nargs++] = n->out[j];
  }
  memset(k, 0, sizeof *k);
  cg_kernel_name(g, gi, k->name, sizeof k->name);
  k->group = gi;
  k->args = args;
  k->nargs = nargs;
  k->nouts = nargs - nin;
  k->flops = flops;
  for (int i = 0; i < nargs; i++) k->bytes += (double)ir_type_bytes(&g->val[args[i]].type);
  /* Memory a kernel reads only in part: a scatter into a state reads its
   * values and indices and writes as many rows of the state (not the whole
   * state twice); a gather reads the rows it picks (not the whole table). */
  for (int i = 0; i < gr->nnodes; i++) {
    const Node *n = &g->node[gr->nodes[i]];
    if (n->op == OP_SCATTER && ir_state_of(g, n->in[0]) >= 0)
      k->bytes -= 2.0 * (double)ir_type_bytes(&g->val[n->in[0]].type) - (double)ir_type_bytes(&g->val[n->in[2]].type);
    else if (n->op == OP_GATHER && g->val[n->in[0]].kind == VK_CONST && gr->nnodes == 1)
      k->bytes -= (double)ir_type_bytes(&g->val[n->in[0]].type) - (double)ir_type_bytes(&g->val[n->out[0]].type);
  }

  int count;
  int anchor = cg_group_anchor(g, gr, &count);
  if (count > 1)
    return st_error(ST_UNSUPPORTED, "group %s has %d reduction/contraction/opaque nodes; a kernel is built around one",
                    k->name, count);
  /* An elementwise kernel iterates over its largest result (the others are
   * spread over the same tasks in proportion). */
  const TensorType *main_out = NULL;
  for (int i = nin; i < nargs; i++) {
    const TensorType *t = &g->val[args[i]].type;
    if (!main_out || ir_type_numel(t) > ir_type_numel(main_out)) main_out = t;
  }
  k->ntasks = cg_kernel_tasks(g, anchor, main_out);
  return cg_kernel_range(g, anchor, main_out, k);
}

void cg_kernels_free(Kernel *k, int n) {
  if (!k) return;
  for (int i = 0; i < n; i++) free(k[i].args);
  free(k);
}

/* Position of each group's first member in g->node, for the kernel order. */
static int first_member(const Graph *g, int gi) {
  int first = g->nnode;
  for (int i = 0; i < g->groups[gi].nnodes; i++)
    if (g->groups[gi].nodes[i] < first) first = g->groups[gi].nodes[i];
  return first;
}

smelt_status cg_lower(Graph *g, Kernel **out_kernels, int *out_n) {
  *out_kernels = NULL;
  *out_n = 0;
  for (int i = 0; i < g->nnode; i++) {
    const Node *n = &g->node[i];
    if (n->dead) continue;
    if (n->group < 0 || n->group >= g->ngroups)
      return st_error(ST_INTERNAL, "node '%s' (%s) belongs to no fusion group; run the fuse pass or cg_single_node_groups",
                      ir_node_name(g, n), ir_op_name(n->op));
  }
  RETURN_IF_ERROR(cg_check_ranged(g));
  bool *used_outside = calloc((size_t)(g->nval ? g->nval : 1), sizeof *used_outside);
  int *order = malloc(sizeof(int) * (size_t)(g->ngroups ? g->ngroups : 1));
  int *first = malloc(sizeof(int) * (size_t)(g->ngroups ? g->ngroups : 1));
  Kernel *ks = calloc((size_t)(g->ngroups ? g->ngroups : 1), sizeof *ks);
  if (!used_outside || !order || !first || !ks) {
    free(used_outside), free(order), free(first), free(ks);
    return st_error(ST_NO_MEMORY, "out of memory lowering kernels");
  }
  for (int i = 0; i < g->nnode; i++) {
    const Node *n = &g->node[i];
    if (n->dead) continue;
    for (int j = 0; j < n->nin; j++)
      if (producer_group(g, n->in[j]) != n->group) used_outside[n->in[j]] = true;
  }
  for (int i = 0; i < g->noutputs; i++) used_outside[g->outputs[i]] = true;
  /* a state's update is read by the next run: its kernel writes it */
  for (int i = 0; i < g->nstates; i++) {
    int up = ir_state_update(g, g->states[i]);
    if (up >= 0) used_outside[g->node[up].out[0]] = true;
  }

  /* insertion sort by first member: group counts are small */
  for (int i = 0; i < g->ngroups; i++) {
    first[i] = first_member(g, i);
    int j = i;
    while (j > 0 && first[order[j - 1]] > first[i]) {
      order[j] = order[j - 1];
      j--;
    }
    order[j] = i;
  }
  smelt_status st = NULL;
  int nk = 0;
  for (int i = 0; i < g->ngroups && !st; i++) {
    if (g->groups[order[i]].nnodes == 0) continue; /* emptied by dead-code removal */
    st = lower_group(g, order[i], used_outside, &ks[nk]);
    nk++;
  }
  free(used_outside), free(order), free(first);
  if (st) {
    cg_kernels_free(ks, nk);
    return st;
  }
  *out_kernels = ks;
  *out_n = nk;
  return NULL;
}

smelt_status cg_single_node_groups(Graph *g) {
  for (int i = 0; i < g->nnode; i++)
    if (!g->node[i].dead && g->node[i].group >= 0)
      return st_error(ST_INTERNAL, "cg_single_node_groups: node '%s' is already in group %d",
                      ir_node_name(g, &g->node[i]), g->node[i].group);
  for (int i = 0; i < g->nnode; i++) {
    Node *n = &g->node[i];
    if (n->dead) continue;
    FusionClass fc = ir_op_info(n->op)->fclass;
    GroupKind kind = fc <= FC_INJECTIVE ? GK_ELEMWISE
                     : fc == FC_REDUCTION ? GK_REDUCTION
                     : fc == FC_CONTRACTION ? GK_CONTRACTION
                                            : GK_OPAQUE;
    int gi = ir_add_group(g, kind);
    int *mem = gi < 0 ? NULL : ir_graph_alloc(g, sizeof(int));
    if (!mem) return ir_graph_status(g);
    Group *gr = &g->groups[gi];
    gr->nodes = mem;
    gr->nodes[0] = i;
    gr->nnodes = 1;
    gr->anchor = i;
    n->group = gi;
    char name[96];
    gr->kernel = ir_graph_strdup(g, cg_kernel_name(g, gi, name, sizeof name));
  }
  return NULL;
}
