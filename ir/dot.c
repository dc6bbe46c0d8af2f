/* The IR as a Graphviz DOT graph (smelt inspect --graph, smelt compile
 * --graph-after).
 *
 * Nodes are labelled with their YAML names and ops; inputs and states are
 * ellipses, constants small boxes (their name, type and how they were
 * made), nodes boxes.  Each fusion group is a cluster titled with its
 * kernel, kind, footprint and the budget it was checked against.  An edge
 * is a tensor: its type and bytes.  Graph outputs are double octagons
 * pointing at the value. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

/* Writes s with the characters DOT strings need escaped. */
static void put_escaped(FILE *f, const char *s) {
  for (; s && *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', f);
    if (*s == '\n') {
      fputs("\\n", f);
      continue;
    }
    fputc(*s, f);
  }
}

static void bytes_str(size_t b, char *buf, size_t cap) {
  if (b >= (1u << 20)) snprintf(buf, cap, "%.1f MiB", (double)b / (1 << 20));
  else if (b >= 1024) snprintf(buf, cap, "%.1f KiB", (double)b / 1024);
  else snprintf(buf, cap, "%zu B", b);
}

/* The DOT id of what defines value v: "n12" for a node result, "v7" for an
 * input, state or constant. */
static void def_id(const Graph *g, int v, char *buf, size_t cap) {
  if (g->val[v].kind == VK_NODE) snprintf(buf, cap, "n%d", g->val[v].node);
  else snprintf(buf, cap, "v%d", v);
}

static void put_node(FILE *f, const Graph *g, int i, const char *indent) {
  const Node *n = &g->node[i];
  char ty[128];
  fprintf(f, "%sn%d [shape=box, style=\"rounded\", label=\"", indent, i);
  put_escaped(f, ir_node_name(g, n));
  fprintf(f, "\\n%s", ir_op_name(n->op));
  if (n->nout == 1) fprintf(f, " -> %s", ir_type_str(&g->val[n->out[0]].type, ty, sizeof ty));
  fputs("\"];\n", f);
}

void ir_print_dot(FILE *f, const Graph *g) {
  int *uses = ir_use_counts(g);
  char ty[128], a[32], b[32];
  fputs("digraph smelt {\n  rankdir=TB;\n  node [fontname=\"Helvetica\", fontsize=10];\n"
        "  edge [fontname=\"Helvetica\", fontsize=8];\n  label=\"",
        f);
  put_escaped(f, g->name);
  fputs("\";\n", f);
  for (int v = 0; v < g->nval; v++) {
    const Value *val = &g->val[v];
    if (val->kind == VK_INPUT) {
      fprintf(f, "  v%d [shape=ellipse, label=\"%s ", v, val->state ? "state" : "input");
      put_escaped(f, val->name);
      fprintf(f, "\\n%s\"%s];\n", ir_type_str(&val->type, ty, sizeof ty), val->state ? ", style=dashed" : "");
    } else if (val->kind == VK_CONST && uses && uses[v] > 0) {
      fprintf(f, "  v%d [shape=box, fontsize=8, style=filled, fillcolor=\"#eeeeee\", label=\"", v);
      put_escaped(f, val->name);
      fprintf(f, "\\n%s", ir_type_str(&val->type, ty, sizeof ty));
      if (val->init) {
        fputs("\\n", f);
        put_escaped(f, val->init);
      }
      fputs("\"];\n", f);
    }
  }
  /* grouped nodes in clusters, the others on their own */
  for (int k = 0; k < g->ngroups; k++) {
    const Group *gr = &g->groups[k];
    bytes_str((size_t)(gr->footprint > 0 ? gr->footprint : 0), a, sizeof a);
    bytes_str((size_t)(gr->budget > 0 ? gr->budget : 0), b, sizeof b);
    fprintf(f, "  subgraph cluster_%d {\n    style=filled; fillcolor=\"#eef4ff\"; label=\"", k);
    put_escaped(f, gr->kernel ? gr->kernel : "?");
    fprintf(f, "\\n%s, footprint %s of %s\";\n", ir_group_kind_name(gr->kind), a, b);
    for (int j = 0; j < gr->nnodes; j++)
      if (!g->node[gr->nodes[j]].dead) put_node(f, g, gr->nodes[j], "    ");
    fputs("  }\n", f);
  }
  for (int i = 0; i < g->nnode; i++)
    if (!g->node[i].dead && (g->node[i].group < 0 || g->node[i].group >= g->ngroups)) put_node(f, g, i, "  ");
  /* edges: one per operand */
  for (int i = 0; i < g->nnode; i++) {
    const Node *n = &g->node[i];
    if (n->dead) continue;
    for (int j = 0; j < n->nin; j++) {
      int v = n->in[j];
      char from[32];
      def_id(g, v, from, sizeof from);
      bytes_str(ir_type_bytes(&g->val[v].type), a, sizeof a);
      fprintf(f, "  %s -> n%d [label=\"%s\\n%s\"%s];\n", from, i, ir_type_str(&g->val[v].type, ty, sizeof ty), a,
              g->val[v].kind == VK_CONST ? ", color=gray" : "");
    }
  }
  for (int o = 0; o < g->noutputs; o++) {
    char from[32];
    def_id(g, g->outputs[o], from, sizeof from);
    fprintf(f, "  out%d [shape=doubleoctagon, label=\"output ", o);
    put_escaped(f, g->val[g->outputs[o]].name);
    fprintf(f, "\"];\n  %s -> out%d;\n", from, o);
  }
  for (int s = 0; s < g->nstates; s++) {
    int up = ir_state_update(g, g->states[s]);
    if (up >= 0) fprintf(f, "  n%d -> v%d [style=dashed, label=\"in place\", constraint=false];\n", up, g->states[s]);
  }
  fputs("}\n", f);
  free(uses);
}
