/* The verifier: structural invariants every pass must keep.
 *
 *  - every live node's operands are live values defined before it
 *    (nodes are in topological order), its results point back at it;
 *  - operand and result counts match the op table, attributes match the
 *    schema (no unknown ones, required ones present, right types);
 *  - every result type is what shape inference computes from the operands;
 *  - live value names are unique; graph outputs are live.
 *
 * Re-running inference needs to write result types, so the verifier saves
 * them, infers, compares and restores: the graph is unchanged on return. */
#include <stdlib.h>
#include <string.h>

#include "ir.h"

static smelt_status bad(const Graph *g, const Node *n, const char *what) {
  return st_error(ST_INTERNAL, "verifier: node '%s' (%s): %s", ir_node_name(g, n), ir_op_name(n->op), what);
}

static bool value_live(const Graph *g, int v) {
  if (v < 0 || v >= g->nval) return false;
  const Value *x = &g->val[v];
  if (x->kind == VK_DEAD) return false;
  if (x->kind == VK_NODE) return x->node >= 0 && x->node < g->nnode && !g->node[x->node].dead;
  if (x->kind == VK_CONST) return x->data != NULL;
  return true;
}

static smelt_status check_attrs(const Graph *g, const Node *n) {
  int na = ir_op_attr_count(n->op);
  for (int i = 0; i < n->nattr; i++) {
    bool known = false;
    for (int j = 0; j < na && !known; j++) {
      AttrSpec s;
      ir_op_attr_spec(n->op, j, &s);
      if (strcmp(s.name, n->attr[i].name) == 0) {
        known = true;
        if (s.type != n->attr[i].type) return bad(g, n, "attribute has the wrong type");
      }
    }
    if (!known) return bad(g, n, "attribute not in the op's schema");
  }
  for (int j = 0; j < na; j++) {
    AttrSpec s;
    ir_op_attr_spec(n->op, j, &s);
    if ((s.required || s.has_default) && !ir_attr(n, s.name)) return bad(g, n, "required or defaulted attribute missing");
  }
  return NULL;
}

smelt_status ir_check_states(const Graph *g) {
  int *uses = ir_use_counts(g);
  if (!uses) return st_error(ST_NO_MEMORY, "out of memory");
  smelt_status st = NULL;
  for (int i = 0; i < g->nstates && !st; i++) {
    int v = g->states[i];
    const Value *sv = &g->val[v];
    if (sv->kind != VK_INPUT || !sv->state) {
      st = st_error(ST_INTERNAL, "state %d is value %d, which is not a state tensor", i, v);
      break;
    }
    int up = ir_state_update(g, v);
    if (up >= 0 && uses[v] != 1)
      st = st_at(g->node[up].loc,
                 "state '%s' is updated in place by node '%s' (scatter), so nothing else may read it: "
                 "read the scatter's result instead",
                 sv->name, ir_node_name(g, &g->node[up]));
    for (int o = 0; o < g->noutputs && !st; o++)
      if (ir_state_of(g, g->outputs[o]) == v)
        st = st_at(sv->loc, "state '%s' cannot be a model output (sessions read state through the API)",
                   sv->name);
  }
  for (int i = 0; i < g->nnode && !st; i++) {
    const Node *n = &g->node[i];
    if (n->dead || n->op != OP_SCATTER) continue;
    if (g->val[n->in[0]].kind == VK_NODE && ir_state_of(g, n->in[0]) >= 0)
      st = st_at(n->loc, "node '%s' (scatter) updates a state twice in one run", ir_node_name(g, n));
  }
  free(uses);
  return st;
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

smelt_status ir_verify(const Graph *g) {
  Graph *mg = (Graph *)g; /* only for the save-infer-restore below */
  char *defined = calloc((size_t)g->nval + 1, 1);
  if (!defined) return st_error(ST_NO_MEMORY, "out of memory");
  smelt_status st = NULL;
  for (int v = 0; v < g->nval; v++)
    if (g->val[v].kind == VK_INPUT || (g->val[v].kind == VK_CONST && g->val[v].data)) defined[v] = 1;
  for (int i = 0; i < g->nnode && !st; i++) {
    const Node *n = &g->node[i];
    if (n->dead) continue;
    const OpInfo *oi = ir_op_info(n->op);
    if (n->nin < oi->min_in || n->nin > oi->max_in || (oi->nout >= 0 && n->nout != oi->nout)) {
      st = bad(g, n, "operand or result count differs from the op table");
      break;
    }
    for (int j = 0; j < n->nin && !st; j++)
      if (!value_live(g, n->in[j]) || !defined[n->in[j]]) st = bad(g, n, "uses a value that is not defined before it");
    for (int j = 0; j < n->nout && !st; j++) {
      const Value *o = &g->val[n->out[j]];
      if (o->kind != VK_NODE || o->node != i || o->out_index != j) st = bad(g, n, "result does not point back at its node");
      defined[n->out[j]] = 1;
    }
    if (st) break;
    st = check_attrs(g, n);
    if (st) break;
    TensorType saved[64]; /* split has at most 64 results (ops.def limits inputs; frontend limits outputs) */
    if (n->nout > 64) {
      st = bad(g, n, "more than 64 results");
      break;
    }
    int nsave = n->nout;
    for (int j = 0; j < nsave; j++) saved[j] = g->val[n->out[j]].type;
    smelt_status ist = ir_infer_node(mg, i);
    bool same = true;
    for (int j = 0; j < nsave; j++) {
      if (!ir_type_equal(&saved[j], &g->val[n->out[j]].type)) same = false;
      mg->val[n->out[j]].type = saved[j];
    }
    if (ist) {
      st = st_prefix(ist, "verifier");
    } else if (!same) {
      st = bad(g, n, "result type differs from shape inference");
    }
  }
  /* live names must be unique: sort them and compare neighbours */
  int *uses = st ? NULL : ir_use_counts(g);
  if (!st && !uses) st = st_error(ST_NO_MEMORY, "out of memory");
  const char **names = uses ? malloc(sizeof(char *) * ((size_t)g->nval + 1)) : NULL;
  int nnames = 0;
  for (int a = 0; names && a < g->nval; a++)
    if (value_live(g, a) && !(g->val[a].kind == VK_CONST && !uses[a])) names[nnames++] = g->val[a].name;
  if (names) {
    qsort(names, (size_t)nnames, sizeof *names, cmp_names);
    for (int a = 1; a < nnames && !st; a++)
      if (strcmp(names[a - 1], names[a]) == 0)
        st = st_error(ST_INTERNAL, "verifier: two live values are named '%s'", names[a]);
  } else if (uses) {
    st = st_error(ST_NO_MEMORY, "out of memory");
  }
  free(names);
  for (int i = 0; i < g->noutputs && !st; i++)
    if (!value_live(g, g->outputs[i])) st = st_error(ST_INTERNAL, "verifier: graph output %d is not live", i);
  free(uses);
  free(defined);
  if (!st) st = ir_check_states(g);
  return st;
}
