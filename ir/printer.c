/* The one textual form of the IR.
 *
 *   graph NAME {
 *     input x: f32[16,64]
 *     state layer.0/k_cache: f32[1,2,256,16] <- layer.0/kc
 *     const layer.0/wq: f32[64,64] = from "layers.0.wq"
 *     layer.0/h: f32[16,64] = rms_norm(x, layer.0/attn_norm) {axis=-1, eps=1e-06}
 *     output y
 *   }
 *
 * Values appear under their YAML names.  Constants are shown when something
 * uses them: small ones with their values, others with how they were made
 * and a hash of their bytes, so an expected-IR test notices changed data.
 * Attributes print in schema order, so the text does not depend on the order
 * of keys in the YAML.  After fusion, the nodes of each group are printed
 * inside a `group KERNEL (kind, footprint, budget) { ... }` block; after
 * memory planning, intermediates show their arena offset (`@4096`). */
#include <stdlib.h>
#include <string.h>

#include "ir.h"

/* The content hash printed after a constant: FNV-1a of its bytes; of
 * 4-byte words from 1 MiB on, four lanes at once (a byte-serial hash of
 * a 700 MB model took a second of every compile), folded into one. */
static uint32_t fnv1a(const void *p, size_t n) {
  const unsigned char *b = p;
  uint32_t h = 2166136261u;
  size_t i = 0;
  if (n >= ((size_t)1 << 20)) {
    uint32_t lane[4] = {h, h ^ 1u, h ^ 2u, h ^ 3u};
    for (; i + 16 <= n; i += 16)
      for (int l = 0; l < 4; l++) {
        uint32_t w;
        memcpy(&w, b + i + 4 * l, 4);
        lane[l] = (lane[l] ^ w) * 16777619u;
      }
    for (int l = 0; l < 4; l++) h = (h ^ lane[l]) * 16777619u;
  }
  for (; i < n; i++) h = (h ^ b[i]) * 16777619u;
  return h;
}

static void print_type(FILE *f, const TensorType *t) {
  char buf[256];
  fputs(ir_type_str(t, buf, sizeof buf), f);
}

static void print_const(FILE *f, const Value *v) {
  fprintf(f, "  const %s: ", v->name);
  print_type(f, &v->type);
  int64_t n = ir_type_numel(&v->type);
  fputs(" = ", f);
  if (n <= 8 && v->data) {
    fputc('[', f);
    for (int64_t i = 0; i < n; i++) fprintf(f, i ? ", %.7g" : "%.7g", dt_load(v->type.dt, v->data, (size_t)i));
    fputc(']', f);
    if (v->init && strcmp(v->init, "value") != 0) fprintf(f, " (%s)", v->init);
  } else {
    fprintf(f, "%s", v->init ? v->init : "data");
    if (v->data) fprintf(f, " #%08x", fnv1a(v->data, ir_type_bytes(&v->type)));
  }
  fputc('\n', f);
}

static void print_attr(FILE *f, const Attr *a) {
  fprintf(f, "%s=", a->name);
  switch (a->type) {
  case AT_INT: fprintf(f, "%lld", (long long)a->i); break;
  case AT_BOOL: fputs(a->i ? "true" : "false", f); break;
  case AT_FLOAT: fprintf(f, "%.9g", a->f); break;
  case AT_DTYPE: fputs(dt_name(a->dt), f); break;
  case AT_ENUM: fputs(a->s, f); break;
  case AT_INTS:
    fputc('[', f);
    for (int i = 0; i < a->n; i++) fprintf(f, i ? ",%lld" : "%lld", (long long)a->ints[i]);
    fputc(']', f);
    break;
  }
}

static void print_node(FILE *f, const Graph *g, const Node *n, const char *indent) {
  fputs(indent, f);
  for (int i = 0; i < n->nout; i++) {
    const Value *v = &g->val[n->out[i]];
    fprintf(f, "%s%s: ", i ? ", " : "", v->name);
    print_type(f, &v->type);
    if (v->mem_offset >= 0) fprintf(f, " @%lld", (long long)v->mem_offset);
  }
  fprintf(f, " = %s(", ir_op_name(n->op));
  for (int i = 0; i < n->nin; i++) fprintf(f, "%s%s", i ? ", " : "", g->val[n->in[i]].name);
  fputc(')', f);
  int na = ir_op_attr_count(n->op), printed = 0;
  for (int i = 0; i < na; i++) {
    AttrSpec s;
    ir_op_attr_spec(n->op, i, &s);
    const Attr *a = ir_attr(n, s.name);
    if (!a) continue;
    fputs(printed++ ? ", " : " {", f);
    print_attr(f, a);
  }
  if (printed) fputc('}', f);
  fputc('\n', f);
}

void ir_print(FILE *f, const Graph *g) {
  int *uses = ir_use_counts(g);
  fprintf(f, "graph %s {\n", g->name);
  for (int i = 0; i < g->nranges; i++)
    fprintf(f, "  range %s: %lld..%lld\n", g->ranges[i].name, (long long)g->ranges[i].min, (long long)g->ranges[i].max);
  for (int i = 0; i < g->ninputs; i++) {
    const Value *v = &g->val[g->inputs[i]];
    fprintf(f, "  input %s: ", v->name);
    print_type(f, &v->type);
    fputc('\n', f);
  }
  for (int i = 0; i < g->nstates; i++) {
    const Value *v = &g->val[g->states[i]];
    fprintf(f, "  state %s: ", v->name);
    print_type(f, &v->type);
    int up = ir_state_update(g, g->states[i]);
    if (up >= 0) fprintf(f, " <- %s", g->val[g->node[up].out[0]].name);
    fputc('\n', f);
  }
  for (int v = 0; v < g->nval; v++)
    if (g->val[v].kind == VK_CONST && (!uses || uses[v] > 0)) print_const(f, &g->val[v]); /* !uses: out of memory */
  int open_group = -1;
  for (int i = 0; i < g->nnode; i++) {
    const Node *n = &g->node[i];
    if (n->dead) continue;
    if (n->group != open_group) {
      if (open_group >= 0) fputs("  }\n", f);
      open_group = n->group;
      if (open_group >= 0 && open_group < g->ngroups) {
        const Group *gr = &g->groups[open_group];
        fprintf(f, "  group %s (%s, %d node%s, footprint %lld B, budget %lld B) {\n", gr->kernel ? gr->kernel : "?",
                ir_group_kind_name(gr->kind), gr->nnodes, gr->nnodes == 1 ? "" : "s", (long long)gr->footprint,
                (long long)gr->budget);
      }
    }
    print_node(f, g, n, open_group >= 0 ? "    " : "  ");
  }
  if (open_group >= 0) fputs("  }\n", f);
  if (g->arena_bytes > 0)
    fprintf(f, "  memory: arena %lld B for intermediates of %lld B\n", (long long)g->arena_bytes,
            (long long)g->unplanned_bytes);
  for (int i = 0; i < g->noutputs; i++) fprintf(f, "  output %s\n", g->val[g->outputs[i]].name);
  fputs("}\n", f);
  free(uses);
}

char *ir_print_str(const Graph *g) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return NULL;
  ir_print(f, g);
  fclose(f);
  return buf;
}
