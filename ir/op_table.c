/* The operator table, generated from ops.def, and the parser of its
 * attribute schemas.  Schemas are short strings ("axis:int=-1 eps:float=1e-05")
 * parsed on demand: they are read rarely (frontend, printer), and keeping
 * them as text in ops.def means one line holds every fact about an op. */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

/* Unsized, so that the static assert below sees an entry too many or too
 * few (the table and the enum both come from ops.def, but nothing else
 * would catch an edit that breaks the pattern). */
static const OpInfo op_table[] = {
#define OP(id, name, mn, mx, nout, fc, attrs, infer, ref) [OP_##id] = {name, mn, mx, nout, fc, attrs},
#include "ops.def"
#undef OP
};
_Static_assert(sizeof op_table / sizeof op_table[0] == OP_COUNT, "op_table: one entry per op of ops.def");

const OpInfo *ir_op_info(Op op) {
  assert(op >= 0 && op < OP_COUNT);
  return &op_table[op];
}

const char *ir_op_name(Op op) { return op >= 0 && op < OP_COUNT ? op_table[op].name : "?"; }

Op ir_op_from_name(const char *name) {
  for (int i = 0; i < OP_COUNT; i++)
    if (strcmp(op_table[i].name, name) == 0) return (Op)i;
  return OP_COUNT;
}

const char *ir_fusion_class_name(FusionClass fc) {
  static const char *names[] = {"elementwise", "broadcast", "injective", "reduction", "contraction", "opaque"};
  _Static_assert(sizeof names / sizeof names[0] == FC_OPAQUE + 1, "fusion class names: one per FusionClass");
  return fc >= FC_ELEMWISE && fc <= FC_OPAQUE ? names[fc] : "?";
}

/* Finds the i-th space-separated item of the schema; returns its length. */
static const char *spec_item(const char *s, int i, size_t *len) {
  for (;;) {
    while (*s == ' ') s++;
    if (!*s) return NULL;
    const char *e = s;
    int depth = 0;
    while (*e && (*e != ' ' || depth > 0)) {
      if (*e == '(' || *e == '[') depth++;
      if (*e == ')' || *e == ']') depth--;
      e++;
    }
    if (i-- == 0) {
      *len = (size_t)(e - s);
      return s;
    }
    s = e;
  }
}

int ir_op_attr_count(Op op) {
  size_t len;
  int n = 0;
  while (spec_item(ir_op_info(op)->attrs, n, &len)) n++;
  return n;
}

static void copy_str(char *dst, size_t cap, const char *s, size_t n) {
  assert(n < cap);
  memcpy(dst, s, n);
  dst[n] = 0;
}

void ir_op_attr_spec(Op op, int i, AttrSpec *out) {
  size_t len;
  const char *s = spec_item(ir_op_info(op)->attrs, i, &len);
  assert(s);
  memset(out, 0, sizeof *out);
  const char *colon = memchr(s, ':', len);
  assert(colon);
  copy_str(out->name, sizeof out->name, s, (size_t)(colon - s));
  const char *t = colon + 1, *end = s + len;
  const char *eq = memchr(t, '=', (size_t)(end - t));
  const char *tend = eq ? eq : end;
  if (tend[-1] == '?') tend--;
  else if (!eq) out->required = true;
  if (eq) {
    out->has_default = true;
    copy_str(out->dflt, sizeof out->dflt, eq + 1, (size_t)(end - eq - 1));
  }
  size_t tl = (size_t)(tend - t);
  if (tl == 3 && !memcmp(t, "int", 3)) out->type = AT_INT;
  else if (tl == 5 && !memcmp(t, "float", 5)) out->type = AT_FLOAT;
  else if (tl == 4 && !memcmp(t, "bool", 4)) out->type = AT_BOOL;
  else if (tl == 4 && !memcmp(t, "ints", 4)) out->type = AT_INTS;
  else if (tl == 5 && !memcmp(t, "dtype", 5)) out->type = AT_DTYPE;
  else if (tl > 6 && !memcmp(t, "enum(", 5)) {
    out->type = AT_ENUM;
    copy_str(out->enum_words, sizeof out->enum_words, t + 5, tl - 6);
  } else
    assert(!"bad attribute type in ops.def");
}
