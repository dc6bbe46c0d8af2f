/* Graph construction and rewriting primitives.
 *
 * Values and nodes live in two growable arrays and are named by index.
 * Everything else a graph refers to (names, operand arrays, attributes,
 * constant data) is carved from the graph's arena.  Rewrites never delete in
 * place: a pass marks nodes dead and rewires uses, and ir_graph_compact()
 * later drops dead nodes and restores topological order with a stable
 * depth-first sort, so passes may append nodes wherever convenient. */
#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

/* Out of memory.  Adding to a graph does not fail where it is called (a
 * frontend or a pass adds many values and nodes between two points where it
 * returns a status): a failed allocation marks the graph (g->oom, as ByteBuf
 * marks itself in ir/bytes.c) and the call carries on with scratch storage
 * that is safe to read and write, so that the caller can finish its step and
 * return ir_graph_status(g), ST_NO_MEMORY.  A graph so marked is only fit to
 * be destroyed.  The scratch: a value or node that found no room is built in
 * the slot past the end of its array (there is always one: reserve()) and
 * not counted; operand and result lists too long for the arena go to a
 * per-thread buffer; a name becomes ""; a node whose attributes could not
 * be stored has none and reads every attribute as zero (lost_attrs). */
enum { SINK_IDS = 1024, SINK_INTS = 64 };
static _Thread_local int sink_in[SINK_IDS], sink_out[SINK_IDS];
static _Thread_local Attr sink_attr;
static const int64_t zero_ints[SINK_INTS];
static const Attr lost_attrs[1];
static const Attr zero_attr = {.name = "", .type = AT_INT, .ints = zero_ints, .s = ""};

/* Makes room for n + 2 elements in *arr (the next one and the spare slot);
 * false, with the graph marked, when there is no memory for it. */
static bool reserve(Graph *g, void **arr, int n, int *cap, size_t elem) {
  if (n + 2 <= *cap) return true;
  int c = *cap ? *cap : 8;
  while (c < n + 2) c *= 2;
  void *p = realloc(*arr, (size_t)c * elem);
  if (!p) {
    g->oom = true;
    return false;
  }
  *arr = p;
  *cap = c;
  return true;
}

static void *xarena(Graph *g, size_t n) {
  void *p = arena_alloc(&g->arena, n);
  if (!p) g->oom = true;
  return p;
}

static const char *xstrdup(Graph *g, const char *s) {
  if (!s) return NULL;
  char *p = xarena(g, strlen(s) + 1);
  return p ? strcpy(p, s) : "";
}

#define GROW(gr, arr, n, cap) reserve((gr), (void **)&(arr), (n), &(cap), sizeof *(arr))

smelt_status ir_graph_status(const Graph *g) {
  return g->oom ? st_error(ST_NO_MEMORY, "out of memory building the graph") : NULL;
}

int64_t ir_type_numel(const TensorType *t) {
  int64_t n = 1;
  for (int i = 0; i < t->rank; i++) n *= t->dim[i];
  return n;
}

void ir_type_blocks(const TensorType *t, int axis, size_t *outer, size_t *block) {
  *outer = 1;
  *block = dt_size(t->dt);
  for (int d = 0; d < t->rank; d++) {
    if (d < axis) *outer *= (size_t)t->dim[d];
    else *block *= (size_t)t->dim[d];
  }
}

/* Bits, so that a packed 4-bit tensor of odd size takes its last half byte. */
size_t ir_type_bytes(const TensorType *t) { return ((size_t)ir_type_numel(t) * (size_t)dt_bits(t->dt) + 7) / 8; }

bool ir_type_equal(const TensorType *a, const TensorType *b) {
  if (a->dt != b->dt || a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->dim[i] != b->dim[i]) return false;
  return true;
}

bool ir_type_dynamic(const TensorType *t) {
  for (int i = 0; i < t->rank; i++)
    if (t->dyn[i]) return true;
  return false;
}

int64_t ir_type_extent(const TensorType *t, int a, const int64_t *dims) {
  if (!t->dyn[a] || !dims) return t->dim[a];
  return (int64_t)t->dyn_a[a] * dims[t->dyn[a] - 1] + t->dyn_b[a];
}

/* A ranged axis prints as "<=MAX" (its extent at the range's max). */
char *ir_type_str(const TensorType *t, char *buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "%s[", dt_name(t->dt));
  for (int i = 0; i < t->rank && k < n; i++)
    k += (size_t)snprintf(buf + k, n - k, "%s%s%lld", i ? "," : "", t->dyn[i] ? "<=" : "", (long long)t->dim[i]);
  if (k < n) snprintf(buf + k, n - k, "]");
  return buf;
}

Graph *ir_graph_create(const char *name) {
  Graph *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->name = xstrdup(g, name ? name : "model");
  /* the spare slots exist from the start */
  GROW(g, g->val, 0, g->cap_val);
  GROW(g, g->node, 0, g->cap_node);
  if (g->oom) {
    ir_graph_destroy(g);
    return NULL;
  }
  return g;
}

void ir_graph_destroy(Graph *g) {
  if (!g) return;
  free(g->val);
  free(g->node);
  free(g->inputs);
  free(g->outputs);
  free(g->states);
  free(g->groups);
  arena_free_all(&g->arena);
  free(g);
}

static int new_value(Graph *g, const char *name, ValueKind kind, SrcLoc loc) {
  bool room = GROW(g, g->val, g->nval, g->cap_val);
  int id = g->nval; /* without room, the spare slot (see "Out of memory") */
  Value *v = &g->val[id];
  memset(v, 0, sizeof *v);
  v->name = xstrdup(g, name);
  v->kind = kind;
  v->node = -1;
  v->loc = loc;
  v->mem_offset = -1;
  if (room) g->nval++;
  return id;
}

int ir_add_input(Graph *g, const char *name, TensorType t, SrcLoc loc) {
  int v = new_value(g, name, VK_INPUT, loc);
  g->val[v].type = t;
  if (GROW(g, g->inputs, g->ninputs, g->cap_inputs)) g->inputs[g->ninputs++] = v;
  return v;
}

int ir_add_state(Graph *g, const char *name, TensorType t, SrcLoc loc) {
  int v = new_value(g, name, VK_INPUT, loc);
  g->val[v].type = t;
  g->val[v].state = true;
  if (GROW(g, g->states, g->nstates, g->cap_states)) g->states[g->nstates++] = v;
  return v;
}

int ir_state_update(const Graph *g, int state) {
  for (int i = 0; i < g->nnode; i++) {
    const Node *n = &g->node[i];
    if (!n->dead && n->op == OP_SCATTER && n->nin > 0 && n->in[0] == state) return i;
  }
  return -1;
}

int ir_state_of(const Graph *g, int v) {
  if (v < 0 || v >= g->nval) return -1;
  const Value *val = &g->val[v];
  if (val->kind == VK_INPUT && val->state) return v;
  if (val->kind != VK_NODE) return -1;
  const Node *n = &g->node[val->node];
  if (n->op != OP_SCATTER || n->dead) return -1;
  int d = n->in[0];
  return g->val[d].kind == VK_INPUT && g->val[d].state ? d : -1;
}

int ir_add_const(Graph *g, const char *name, TensorType t, const void *data, SrcLoc loc) {
  int v = new_value(g, name, VK_CONST, loc);
  size_t n = ir_type_bytes(&t);
  void *p = xarena(g, n ? n : 1); /* NULL when out of memory: see ir.h */
  if (data && p) memcpy(p, data, n);
  g->val[v].type = t;
  g->val[v].data = p;
  return v;
}

int ir_add_node(Graph *g, Op op, int nin, const int *in, int nout, const char *const *out_names,
                SrcLoc loc) {
  assert(op >= 0 && op < OP_COUNT && nin >= 0 && nout >= 1);
  bool room = GROW(g, g->node, g->nnode, g->cap_node);
  int id = g->nnode; /* without room, the spare slot */
  if (room) g->nnode++;
  Node *n = &g->node[id];
  memset(n, 0, sizeof *n);
  n->op = op;
  n->in = xarena(g, sizeof(int) * (size_t)(nin ? nin : 1));
  n->out = xarena(g, sizeof(int) * (size_t)nout);
  if (!n->in) n->in = sink_in, nin = nin < SINK_IDS ? nin : SINK_IDS;
  if (!n->out) n->out = sink_out, nout = nout < SINK_IDS ? nout : SINK_IDS;
  n->nin = nin;
  n->nout = nout;
  for (int i = 0; i < nin; i++) {
    /* a value added without room sits just past the end */
    assert(in[i] >= 0 && in[i] < g->nval + (g->oom ? 1 : 0));
    n->in[i] = in[i];
  }
  n->loc = loc;
  n->group = -1;
  for (int i = 0; i < nout; i++) {
    int v = new_value(g, out_names[i], VK_NODE, loc);
    g->val[v].node = id;
    g->val[v].out_index = i;
    g->node[id].out[i] = v; /* g->node may not move here, but be explicit */
  }
  return id;
}

void *ir_graph_alloc(Graph *g, size_t bytes) { return xarena(g, bytes ? bytes : 1); }
const char *ir_graph_strdup(Graph *g, const char *s) { return xstrdup(g, s); }

const char *ir_graph_printf(Graph *g, const char *fmt, ...) {
  char small[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) return "";
  char *p = xarena(g, (size_t)n + 1);
  if (!p) return "";
  if ((size_t)n < sizeof small) {
    memcpy(p, small, (size_t)n + 1);
  } else {
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
  }
  return p;
}

const char *ir_group_kind_name(GroupKind k) {
  static const char *names[] = {"elementwise", "reduction", "contraction", "opaque"};
  return k >= GK_ELEMWISE && k <= GK_OPAQUE ? names[k] : "?";
}

int ir_add_group(Graph *g, GroupKind kind) {
  Group *ng = realloc(g->groups, sizeof(Group) * (size_t)(g->ngroups + 1));
  if (!ng) {
    g->oom = true;
    return -1;
  }
  g->groups = ng;
  Group *gr = &g->groups[g->ngroups];
  memset(gr, 0, sizeof *gr);
  gr->kind = kind;
  gr->anchor = -1;
  return g->ngroups++;
}

void ir_add_output(Graph *g, int value) {
  if (GROW(g, g->outputs, g->noutputs, g->cap_outputs)) g->outputs[g->noutputs++] = value;
}

/* A value is live when it is an input, a used constant, or produced by a
 * live node; dead nodes' results and orphaned constants keep their slots
 * but are invisible to lookups and the printer. */
int ir_find_value(const Graph *g, const char *name) {
  for (int v = g->nval - 1; v >= 0; v--) {
    const Value *x = &g->val[v];
    if (x->kind == VK_DEAD || (x->kind == VK_NODE && g->node[x->node].dead)) continue;
    if (strcmp(x->name, name) == 0) return v;
  }
  return -1;
}

/* ---- attributes ---- */

static Attr *attr_slot(Graph *g, int node, const char *name) {
  Node *n = &g->node[node];
  for (int i = 0; i < n->nattr; i++)
    if (strcmp(n->attr[i].name, name) == 0) return &n->attr[i];
  /* out of memory: the node keeps no attributes (see "Out of memory") */
  Attr *a = n->attr == lost_attrs ? NULL : xarena(g, sizeof(Attr) * (size_t)(n->nattr + 1));
  if (!a) {
    n->attr = (Attr *)lost_attrs, n->nattr = 0;
    memset(&sink_attr, 0, sizeof sink_attr);
    return &sink_attr;
  }
  if (n->nattr) memcpy(a, n->attr, sizeof(Attr) * (size_t)n->nattr);
  n->attr = a;
  Attr *s = &a[n->nattr++];
  memset(s, 0, sizeof *s);
  s->name = xstrdup(g, name);
  return s;
}

void ir_set_attr_int(Graph *g, int node, const char *name, int64_t v) {
  Attr *a = attr_slot(g, node, name);
  a->type = AT_INT;
  a->i = v;
}

void ir_set_attr_bool(Graph *g, int node, const char *name, bool v) {
  Attr *a = attr_slot(g, node, name);
  a->type = AT_BOOL;
  a->i = v;
}

void ir_set_attr_float(Graph *g, int node, const char *name, double v) {
  Attr *a = attr_slot(g, node, name);
  a->type = AT_FLOAT;
  a->f = v;
}

void ir_set_attr_ints(Graph *g, int node, const char *name, const int64_t *v, int n) {
  Attr *a = attr_slot(g, node, name);
  int64_t *p = xarena(g, sizeof(int64_t) * (size_t)(n ? n : 1));
  if (p && n) memcpy(p, v, sizeof(int64_t) * (size_t)n);
  a->type = AT_INTS;
  a->ints = p ? p : zero_ints;
  a->n = p ? n : 0;
}

void ir_set_attr_dtype(Graph *g, int node, const char *name, DType dt) {
  Attr *a = attr_slot(g, node, name);
  a->type = AT_DTYPE;
  a->dt = dt;
}

void ir_set_attr_enum(Graph *g, int node, const char *name, const char *word) {
  Attr *a = attr_slot(g, node, name);
  a->type = AT_ENUM;
  a->s = xstrdup(g, word);
}

/* Defaults in ops.def are written in YAML flow syntax: 1e-05, true, [1,1]. */
void ir_fill_default_attrs(Graph *g, int node) {
  Op op = g->node[node].op;
  int na = ir_op_attr_count(op);
  for (int i = 0; i < na; i++) {
    AttrSpec s;
    ir_op_attr_spec(op, i, &s);
    if (!s.has_default || ir_attr(&g->node[node], s.name)) continue;
    switch (s.type) {
    case AT_INT: ir_set_attr_int(g, node, s.name, strtoll(s.dflt, NULL, 10)); break;
    case AT_FLOAT: ir_set_attr_float(g, node, s.name, strtod(s.dflt, NULL)); break;
    case AT_BOOL: ir_set_attr_bool(g, node, s.name, strcmp(s.dflt, "true") == 0); break;
    case AT_DTYPE: ir_set_attr_dtype(g, node, s.name, dt_from_name(s.dflt)); break;
    case AT_ENUM: ir_set_attr_enum(g, node, s.name, s.dflt); break;
    case AT_INTS: {
      int64_t v[IR_MAX_RANK * 2];
      int n = 0;
      for (const char *p = s.dflt + 1; *p && *p != ']';) {
        char *e;
        assert(n < IR_MAX_RANK * 2);
        v[n++] = strtoll(p, &e, 10);
        p = *e == ',' ? e + 1 : e;
      }
      ir_set_attr_ints(g, node, s.name, v, n);
      break;
    }
    }
  }
}

const Attr *ir_attr(const Node *n, const char *name) {
  for (int i = 0; i < n->nattr; i++)
    if (strcmp(n->attr[i].name, name) == 0) return &n->attr[i];
  return NULL;
}

static const Attr *must_attr(const Node *n, const char *name) {
  const Attr *a = ir_attr(n, name);
  if (!a && n->attr == lost_attrs) return &zero_attr; /* out of memory: the graph is marked */
  if (!a) {
    fprintf(stderr, "smelt: internal error: %s node lacks attribute '%s'\n", ir_op_name(n->op), name);
    abort();
  }
  return a;
}

/* An int or bool attribute a node lacks but whose schema has a default
 * (a node built before the attribute existed, or by code that sets only
 * what it cares about): the default. */
int64_t ir_attr_int(const Node *n, const char *name) {
  if (!ir_attr(n, name)) {
    int na = ir_op_attr_count(n->op);
    for (int i = 0; i < na; i++) {
      AttrSpec s;
      ir_op_attr_spec(n->op, i, &s);
      if (strcmp(s.name, name) != 0 || !s.has_default) continue;
      if (s.type == AT_BOOL) return strcmp(s.dflt, "true") == 0;
      if (s.type == AT_INT) return strtoll(s.dflt, NULL, 10);
    }
  }
  return must_attr(n, name)->i;
}
double ir_attr_float(const Node *n, const char *name) { return must_attr(n, name)->f; }
const char *ir_attr_enum(const Node *n, const char *name) { return must_attr(n, name)->s; }

/* ---- rewriting ---- */

void ir_replace_all_uses(Graph *g, int from, int to) {
  for (int i = 0; i < g->nnode; i++) {
    Node *n = &g->node[i];
    if (n->dead) continue;
    for (int j = 0; j < n->nin; j++)
      if (n->in[j] == from) n->in[j] = to;
  }
  for (int i = 0; i < g->noutputs; i++)
    if (g->outputs[i] == from) g->outputs[i] = to;
}

int *ir_use_counts(const Graph *g) {
  int *c = calloc((size_t)(g->nval ? g->nval : 1), sizeof(int));
  if (!c) return NULL;
  for (int i = 0; i < g->nnode; i++) {
    const Node *n = &g->node[i];
    if (n->dead) continue;
    for (int j = 0; j < n->nin; j++) c[n->in[j]]++;
  }
  for (int i = 0; i < g->noutputs; i++) c[g->outputs[i]]++;
  /* a state's update is read by the session's next run */
  for (int i = 0; i < g->nstates; i++) {
    int up = ir_state_update(g, g->states[i]);
    if (up >= 0) c[g->node[up].out[0]]++;
  }
  return c;
}

/* Stable topological sort: visit nodes in their current order and emit each
 * after its producers (iterative DFS, so deep graphs cannot overflow the C
 * stack).  A cycle is an internal error: passes only ever build DAGs. */
smelt_status ir_graph_compact(Graph *g) {
  int n = g->nnode;
  int *state = calloc((size_t)n + 1, sizeof(int)); /* 0 new, 1 on stack, 2 done */
  int *order = malloc(sizeof(int) * ((size_t)n + 1));
  int *stack = malloc(sizeof(int) * ((size_t)n + 1));
  int *pos = malloc(sizeof(int) * ((size_t)n + 1));
  if (!state || !order || !stack || !pos) {
    free(state), free(order), free(stack), free(pos);
    return st_error(ST_NO_MEMORY, "out of memory");
  }
  int norder = 0;
  smelt_status st = NULL;
  for (int root = 0; root < n && !st; root++) {
    if (g->node[root].dead || state[root]) continue;
    int sp = 0;
    stack[sp] = root;
    pos[sp++] = 0;
    state[root] = 1;
    while (sp > 0 && !st) {
      int cur = stack[sp - 1];
      Node *nd = &g->node[cur];
      if (pos[sp - 1] < nd->nin) {
        int v = nd->in[pos[sp - 1]++];
        if (g->val[v].kind != VK_NODE) continue;
        int p = g->val[v].node;
        if (g->node[p].dead) {
          st = st_error(ST_INTERNAL, "internal error: node '%s' uses '%s' whose producer was removed",
                        ir_node_name(g, nd), g->val[v].name);
        } else if (state[p] == 1) {
          st = st_error(ST_INTERNAL, "internal error: cycle through '%s'", g->val[v].name);
        } else if (state[p] == 0) {
          state[p] = 1;
          stack[sp] = p;
          pos[sp++] = 0;
        }
      } else {
        state[cur] = 2;
        order[norder++] = cur;
        sp--;
      }
    }
  }
  /* room for the spare slot too (see "Out of memory") */
  Node *nodes = st ? NULL : malloc(sizeof(Node) * ((size_t)norder + 2));
  if (!st && !nodes) st = st_error(ST_NO_MEMORY, "out of memory");
  if (!st) {
    int *newid = state; /* reuse: old id -> new id */
    for (int i = 0; i < n; i++) newid[i] = -1;
    for (int i = 0; i < norder; i++) {
      nodes[i] = g->node[order[i]];
      newid[order[i]] = i;
    }
    for (int v = 0; v < g->nval; v++) {
      if (g->val[v].kind != VK_NODE) continue;
      g->val[v].node = newid[g->val[v].node];
      if (g->val[v].node < 0) {
        /* the value of a removed node: keep its slot but mark it orphaned */
        g->val[v].kind = VK_DEAD;
      }
    }
    for (int k = 0; k < g->ngroups; k++) {
      Group *gr = &g->groups[k];
      int m = 0;
      for (int j = 0; j < gr->nnodes; j++)
        if (newid[gr->nodes[j]] >= 0) gr->nodes[m++] = newid[gr->nodes[j]];
      gr->nnodes = m;
      gr->anchor = gr->anchor >= 0 ? newid[gr->anchor] : -1;
    }
    free(g->node);
    g->node = nodes;
    g->nnode = norder;
    g->cap_node = norder + 2;
  }
  free(state), free(order), free(stack), free(pos);
  return st;
}

const char *ir_node_name(const Graph *g, const Node *n) { return g->val[n->out[0]].name; }

int ir_norm_axis(int64_t axis, int rank) {
  if (axis < 0) axis += rank;
  return axis >= 0 && axis < rank ? (int)axis : -1;
}

/* A clone that runs out of memory is destroyed (NULL): every step below
 * checks c->oom before it copies into what it allocated. */
Graph *ir_graph_clone(const Graph *g) {
  Graph *c = ir_graph_create(g->name);
  if (!c) return NULL;
  c->file = xstrdup(c, g->file);
  for (int v = 0; v < g->nval && !c->oom; v++) {
    const Value *s = &g->val[v];
    if (!GROW(c, c->val, c->nval, c->cap_val)) break;
    Value *d = &c->val[c->nval++];
    *d = *s;
    d->name = xstrdup(c, s->name);
    d->loc.file = c->file;
    if (s->init) d->init = xstrdup(c, s->init);
    if (s->kind == VK_CONST && s->data) {
      size_t n = ir_type_bytes(&s->type);
      if (!(d->data = xarena(c, n ? n : 1))) break;
      memcpy(d->data, s->data, n);
    }
    if (s->source) { /* into the clone's arena, like everything else */
      IrSource *src = xarena(c, sizeof *src);
      IrCopy *cp = xarena(c, sizeof *cp * (size_t)(s->source->ncopies ? s->source->ncopies : 1));
      if (!src || !cp) break;
      for (int k = 0; k < s->source->ncopies; k++) {
        cp[k] = s->source->copies[k];
        cp[k].file = xstrdup(c, cp[k].file);
        cp[k].name = xstrdup(c, cp[k].name);
      }
      src->ncopies = s->source->ncopies;
      src->copies = cp;
      d->source = src;
    }
  }
  for (int i = 0; i < g->nnode && !c->oom; i++) {
    const Node *s = &g->node[i];
    if (!GROW(c, c->node, c->nnode, c->cap_node)) break;
    Node *d = &c->node[c->nnode++];
    *d = *s;
    d->loc.file = c->file;
    d->in = xarena(c, sizeof(int) * (size_t)(s->nin ? s->nin : 1));
    d->out = xarena(c, sizeof(int) * (size_t)s->nout);
    d->attr = xarena(c, sizeof(Attr) * (size_t)(s->nattr ? s->nattr : 1));
    if (!d->in || !d->out || !d->attr) break;
    memcpy(d->in, s->in, sizeof(int) * (size_t)s->nin);
    memcpy(d->out, s->out, sizeof(int) * (size_t)s->nout);
    for (int a = 0; a < s->nattr; a++) {
      d->attr[a] = s->attr[a];
      d->attr[a].name = xstrdup(c, s->attr[a].name);
      if (s->attr[a].s) d->attr[a].s = xstrdup(c, s->attr[a].s);
      if (s->attr[a].type == AT_INTS) {
        int64_t *p = xarena(c, sizeof(int64_t) * (size_t)(s->attr[a].n ? s->attr[a].n : 1));
        if (!p) break;
        memcpy(p, s->attr[a].ints, sizeof(int64_t) * (size_t)s->attr[a].n);
        d->attr[a].ints = p;
      }
    }
  }
  for (int i = 0; i < g->ninputs; i++)
    if (GROW(c, c->inputs, c->ninputs, c->cap_inputs)) c->inputs[c->ninputs++] = g->inputs[i];
  for (int i = 0; i < g->noutputs; i++) ir_add_output(c, g->outputs[i]);
  for (int i = 0; i < g->nstates; i++)
    if (GROW(c, c->states, c->nstates, c->cap_states)) c->states[c->nstates++] = g->states[i];
  for (int i = 0; i < g->nranges; i++) {
    c->ranges[i] = g->ranges[i];
    c->ranges[i].name = xstrdup(c, g->ranges[i].name);
  }
  c->nranges = g->nranges;
  for (int k = 0; k < g->ngroups && !c->oom; k++) {
    const Group *s = &g->groups[k];
    int id = ir_add_group(c, s->kind);
    if (id < 0) break;
    Group *d = &c->groups[id];
    *d = *s;
    d->nodes = xarena(c, sizeof(int) * (size_t)(s->nnodes ? s->nnodes : 1));
    if (!d->nodes) break;
    memcpy(d->nodes, s->nodes, sizeof(int) * (size_t)s->nnodes);
    d->kernel = xstrdup(c, s->kernel);
  }
  if (c->oom) {
    ir_graph_destroy(c);
    return NULL;
  }
  c->arena_bytes = g->arena_bytes;
  c->unplanned_bytes = g->unplanned_bytes;
  return c;
}
