/* cse: compute each distinct expression once.
 *
 * First constants: two used constants of the same type and bytes, up to
 * 64 KiB each (scales, zeros, small masks; big weights are distinct in
 * practice and comparing them is not worth the time), become one; the one
 * with the lower id stays.  A user's param of more than 16 elements keeps
 * its own name even when its bytes repeat another's (all-ones norm weights
 * of every layer): merging them would save little and make the IR read as
 * if layer 0 used the final norm's weights.  Then nodes, in topological order: a node's key
 * is its op, its operand ids and its attributes compared by value (in any
 * order).  A hash table maps keys to the first node seen with that key; a
 * later node with an equal key is replaced by it.  Because users are rewired
 * as we go and operands always come earlier in the order, operands of a node
 * are already canonical when the node is looked up, so whole duplicated
 * subgraphs collapse in one sweep.
 *
 * A duplicate whose result is a graph output keeps its node unless the
 * survivor can take its place: if the first node is not an output itself,
 * the roles swap (the output's node survives, the first one is forwarded to
 * it); if both are outputs, both stay.
 *
 * Requires: topological order.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"
#include "rewrite.h"

#define CSE_CONST_MAX_BYTES ((size_t)64 << 10)

static uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h;
}

static uint64_t hash_bytes(const void *p, size_t n) {
  const unsigned char *b = p;
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

static uint64_t hash_str(const char *s) { return hash_bytes(s, strlen(s)); }

static uint64_t attr_hash(const Attr *a) {
  uint64_t h = hash_str(a->name) ^ (uint64_t)a->type;
  switch (a->type) {
  case AT_INT:
  case AT_BOOL: return mix(h, (uint64_t)a->i);
  case AT_FLOAT: return mix(h, a->f == 0 ? 0 : hash_bytes(&a->f, sizeof a->f)); /* 0.0 == -0.0 */
  case AT_INTS: return mix(h, hash_bytes(a->ints, sizeof(int64_t) * (size_t)a->n));
  case AT_DTYPE: return mix(h, (uint64_t)a->dt);
  case AT_ENUM: return mix(h, hash_str(a->s));
  }
  return h;
}

static bool attr_equal(const Attr *a, const Attr *b) {
  if (a->type != b->type || strcmp(a->name, b->name) != 0) return false;
  switch (a->type) {
  case AT_INT:
  case AT_BOOL: return a->i == b->i;
  case AT_FLOAT: return a->f == b->f;
  case AT_INTS: return a->n == b->n && (a->n == 0 || !memcmp(a->ints, b->ints, sizeof(int64_t) * (size_t)a->n));
  case AT_DTYPE: return a->dt == b->dt;
  case AT_ENUM: return strcmp(a->s, b->s) == 0;
  }
  return false;
}

static uint64_t node_hash(const Node *n) {
  uint64_t h = mix((uint64_t)n->op, (uint64_t)n->nout);
  for (int i = 0; i < n->nin; i++) h = mix(h, (uint64_t)n->in[i]);
  uint64_t ah = 0; /* order-independent: attributes are a set */
  for (int i = 0; i < n->nattr; i++) ah += attr_hash(&n->attr[i]);
  return mix(h, ah);
}

static bool node_equal(const Node *a, const Node *b) {
  if (a->op != b->op || a->nin != b->nin || a->nout != b->nout || a->nattr != b->nattr) return false;
  for (int i = 0; i < a->nin; i++)
    if (a->in[i] != b->in[i]) return false;
  for (int i = 0; i < a->nattr; i++) {
    const Attr *o = ir_attr(b, a->attr[i].name);
    if (!o || !attr_equal(&a->attr[i], o)) return false;
  }
  return true;
}

static bool any_output(const Graph *g, const Node *n) {
  for (int i = 0; i < n->nout; i++)
    if (pass_is_output(g, n->out[i])) return true;
  return false;
}

/* Replaces node `dup` by node `keep` (same op, operands and attributes). */
static void merge_into(Graph *g, int keep, int dup) {
  for (int i = 0; i < g->node[dup].nout; i++) ir_replace_all_uses(g, g->node[dup].out[i], g->node[keep].out[i]);
  g->node[dup].dead = true;
}

/* Open addressing over node ids; -1 marks an empty slot. */
typedef struct {
  int *slot;
  uint64_t *hash;
  size_t mask;
} Table;

static bool table_init(Table *t, size_t want) {
  size_t cap = 16;
  while (cap < 2 * want) cap *= 2;
  t->slot = malloc(cap * sizeof *t->slot);
  t->hash = malloc(cap * sizeof *t->hash);
  if (!t->slot || !t->hash) {
    free(t->slot);
    free(t->hash);
    return false;
  }
  for (size_t i = 0; i < cap; i++) t->slot[i] = -1;
  t->mask = cap - 1;
  return true;
}

static void table_free(Table *t) {
  free(t->slot);
  free(t->hash);
}

static bool cse_nodes(Graph *g) {
  Table t;
  if (!table_init(&t, (size_t)g->nnode)) return false; /* cse is an optimisation; skipping it is safe */
  bool changed = false;
  for (int id = 0; id < g->nnode; id++) {
    if (g->node[id].dead) continue;
    uint64_t h = node_hash(&g->node[id]);
    size_t i = (size_t)h & t.mask;
    for (; t.slot[i] >= 0; i = (i + 1) & t.mask) {
      int other = t.slot[i];
      if (t.hash[i] != h || !node_equal(&g->node[other], &g->node[id])) continue;
      bool out_dup = any_output(g, &g->node[id]), out_other = any_output(g, &g->node[other]);
      if (out_dup && out_other) break;
      if (out_dup) { /* the output's node survives under its own name */
        merge_into(g, id, other);
        t.slot[i] = id;
      } else {
        merge_into(g, other, id);
      }
      changed = true;
      break;
    }
    if (t.slot[i] < 0) {
      t.slot[i] = id;
      t.hash[i] = h;
    }
  }
  table_free(&t);
  return changed;
}

static bool cse_consts(Graph *g) {
  int *uses = ir_use_counts(g);
  Table t;
  /* out of memory: constants stay as they are (cse is an optimisation) */
  if (!uses || !table_init(&t, (size_t)g->nval)) {
    free(uses);
    return false;
  }
  bool changed = false;
  for (int v = 0; v < g->nval; v++) {
    const Value *c = &g->val[v];
    size_t bytes = ir_type_bytes(&c->type);
    if (c->kind != VK_CONST || !uses[v] || bytes > CSE_CONST_MAX_BYTES || pass_is_output(g, v)) continue;
    bool made_by_pass = !c->init || strcmp(c->init, "folded") == 0;
    if (!made_by_pass && ir_type_numel(&c->type) > 16) continue;
    uint64_t h = mix(hash_bytes(c->data, bytes), (uint64_t)c->type.dt);
    size_t i = (size_t)h & t.mask;
    for (; t.slot[i] >= 0; i = (i + 1) & t.mask) {
      const Value *o = &g->val[t.slot[i]];
      if (t.hash[i] == h && ir_type_equal(&o->type, &c->type) && !memcmp(o->data, c->data, bytes)) break;
    }
    if (t.slot[i] >= 0) {
      ir_replace_all_uses(g, v, t.slot[i]);
      changed = true;
    } else {
      t.slot[i] = v;
      t.hash[i] = h;
    }
  }
  table_free(&t);
  free(uses);
  return changed;
}

smelt_status pass_cse(Graph *g, PassCtx *ctx, bool *changed) {
  (void)ctx;
  bool c1 = cse_consts(g);
  bool c2 = cse_nodes(g);
  *changed = c1 || c2;
  return NULL;
}
