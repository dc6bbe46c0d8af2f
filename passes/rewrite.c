/* Helpers shared by the rewrite passes (see rewrite.h).
 *
 * The one policy decision here is in pass_forward: a pass that proves value
 * A equals value B would like to drop A's node and point A's users at B.
 * When A is a graph output that would rename the model's output (a user who
 * asked for output "y" would find "x" instead), so in that case the node
 * stays; the cost is at most one copy per output.
 */
#include "rewrite.h"

#include <stdio.h>
#include <string.h>

bool pass_is_output(const Graph *g, int v) {
  for (int i = 0; i < g->noutputs; i++)
    if (g->outputs[i] == v) return true;
  return false;
}

Node *pass_producer(Graph *g, int v) {
  if (g->val[v].kind != VK_NODE) return NULL;
  Node *n = &g->node[g->val[v].node];
  return n->dead ? NULL : n;
}

bool pass_const_uniform(const Graph *g, int v, double *out) {
  const Value *c = &g->val[v];
  if (c->kind != VK_CONST || !c->data) return false;
  int64_t n = ir_type_numel(&c->type);
  if (n <= 0) return false;
  double first = dt_load(c->type.dt, c->data, 0);
  for (int64_t i = 1; i < n; i++) {
    double x = dt_load(c->type.dt, c->data, (size_t)i);
    /* == would call NaN different from itself and -0.0 equal to 0.0: compare
     * what the element means (NaN-ness, value, sign of zero) */
    if (x != first && !(x != x && first != first)) return false;
    if (x == 0 && first == 0 && (1 / x) != (1 / first)) return false;
  }
  *out = first;
  return true;
}

const char *pass_fresh_name(Graph *g, const char *base) {
  if (ir_find_value(g, base) < 0) return arena_strdup(&g->arena, base);
  for (int k = 1;; k++) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s.%d", base, k);
    if (ir_find_value(g, buf) < 0) return arena_strdup(&g->arena, buf);
  }
}

void pass_copy_attrs(Graph *g, int dst, int src) {
  /* index, not pointer: setting attributes on dst may not move src, but
   * g->node could in principle be the same array */
  for (int i = 0; i < g->node[src].nattr; i++) {
    Attr a = g->node[src].attr[i];
    switch (a.type) {
    case AT_INT: ir_set_attr_int(g, dst, a.name, a.i); break;
    case AT_BOOL: ir_set_attr_bool(g, dst, a.name, a.i != 0); break;
    case AT_FLOAT: ir_set_attr_float(g, dst, a.name, a.f); break;
    case AT_INTS: ir_set_attr_ints(g, dst, a.name, a.ints, a.n); break;
    case AT_DTYPE: ir_set_attr_dtype(g, dst, a.name, a.dt); break;
    case AT_ENUM: ir_set_attr_enum(g, dst, a.name, a.s); break;
    }
  }
}

bool pass_forward(Graph *g, int from, int to) {
  if (from == to) return false;
  if (pass_is_output(g, from) && strcmp(g->val[from].name, g->val[to].name) != 0) return false;
  ir_replace_all_uses(g, from, to);
  if (g->val[from].kind == VK_NODE) g->node[g->val[from].node].dead = true;
  return true;
}
