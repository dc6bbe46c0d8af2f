/* The YAML model loader: SPEC §2, model format version 1.
 *
 * libyaml's document API loads the whole file into a tree of nodes, each
 * with the line and column where it starts; the loader then walks that tree
 * once and builds the graph directly, so every error it reports can point at
 * the exact key or value at fault ("model.yaml:14:7: error: ...").  Top-level
 * sections are read in dependency order (version, name, seed, dtype, dims,
 * weights, blocks, inputs, params, state, nodes, outputs) whatever their order in
 * the file.  Every mapping is checked for unknown and duplicate keys, so a
 * typo is an error, not a silently ignored setting.
 *
 * Names live in scopes.  The top-level scope holds inputs, params and node
 * results; each copy of a repeated block gets a fresh scope holding the
 * block's inputs (bound to values of the enclosing scope), its params and
 * its node results.  Lookups never leave a scope: a block sees only what is
 * passed to it.  In the IR, a name defined in copy c of block B is prefixed
 * "B.c/" (nested repeats compose: "outer.0/inner.2/q").
 *
 * `repeat: B, times: N` instantiates B N times in a chain: copy 0 takes the
 * repeat node's `in` values; copy c > 0 takes the k outputs of copy c-1 as
 * its first k inputs and the remaining inputs unchanged; the repeat node's
 * `out` names bind to the outputs of the last copy (they are aliases: the
 * values keep their block names, e.g. "layer.3/y").  When one scope repeats
 * the same block more than once, copy numbers continue across the repeats
 * (layer.0-3, then layer.4-7) so IR names stay unique, while `{i}` in a
 * `from:` weight name is the copy's index within its own repeat (0-3 both
 * times), so two repeats can read the same weights.
 *
 * Random param initialisation is deterministic and independent of the
 * order params are declared in.  For a param whose IR name is NAME:
 *   key   = seed ^ fnv1a64(NAME)       (FNV-1a, 64-bit, over the name bytes)
 *   u64_k = splitmix64 output number k (k = 0, 1, 2, ...) of the generator
 *           whose state starts at key: state += 0x9e3779b97f4a7c15, then the
 *           usual splitmix64 finaliser (xor-shift 30, *0xbf58476d1ce4e5b9,
 *           xor-shift 27, *0x94d049bb133111eb, xor-shift 31)
 *   unit  = (u64 >> 11) * 2^-53, in [0, 1)
 *   uniform [LO, HI]: element e = LO + (HI - LO) * unit_e
 *   normal STD: elements are made in pairs by Box-Muller from two draws,
 *           u1 = 1 - unit (in (0, 1]), u2 = unit:  r = sqrt(-2 ln u1),
 *           element 2j = STD * r cos(2 pi u2), element 2j+1 = STD * r sin(2 pi u2)
 * computed in double and rounded to the param's dtype on store.
 *
 * Resource limits (the file is untrusted): model text 64 MiB, YAML nesting
 * 256 levels, repeat nesting 16, times 100000, 1M nodes, 32 GiB per constant
 * and 64 GiB in all.  Every limit is checked before the work it bounds:
 * libyaml's scanner is quadratic in nesting depth (each token looks at every
 * open level), so the text reaches it through a read handler that hands over
 * small chunks and refuses to go on once the scanner is deeper than the limit;
 * names are found through hash tables, so a model of 10^6 nodes loads in
 * linear time.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "fe_internal.h"
#include "format/parallel.h"

#define FE_MAX_MODEL_BYTES ((size_t)64 << 20)
#define FE_MAX_DEPTH 16
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
#define FE_MAX_TIMES 100000
#define FE_MAX_NODES (1 << 20)
#define FE_MAX_CONST_BYTES ((int64_t)1 << 35)
#define FE_MAX_TOTAL_CONST_BYTES ((int64_t)1 << 36)
#else
/* The fuzz build (tests/fuzz): what a fuzzer's 2 GB and its time per input
 * hold.  A valid model of 32 GiB of constants or 10^6 nodes is no bug,
 * only big; the fuzzer would report it as one. */
#define FE_MAX_TIMES 1000
#define FE_MAX_NODES (1 << 14)
#define FE_MAX_CONST_BYTES ((int64_t)1 << 24)
#define FE_MAX_TOTAL_CONST_BYTES ((int64_t)1 << 26)
#endif
#define FE_MAX_LIST 4096 /* names in `in`/`out`, elements of an ints attribute */
/* Nested YAML collections.  A model needs about ten (blocks > block > nodes >
 * node > attribute list, a param value's nested lists up to rank 8). */
#define FE_MAX_YAML_DEPTH 256
/* Bytes the read handler gives libyaml at once: how far past the limit the
 * scanner can get before the depth is checked again. */
#define FE_YAML_CHUNK 256

typedef struct {
  const char *name;
  int64_t value;
} Dim;

typedef struct {
  const char *name; /* local name, as written in the YAML */
  int value;
  SrcLoc loc;
} Binding;

typedef struct {
  const char *block;
  int next;
} RepeatCounter;

/* A hash table from name to a small index (open addressing, linear probing,
 * at most half full).  Names are borrowed, never copied. */
typedef struct {
  const char *name;
  int index;
} NameSlot;

typedef struct {
  NameSlot *slot; /* cap entries; name NULL = empty */
  int cap, n;
} NameIndex;

typedef struct {
  Binding *bind;
  int nbind, cap_bind;
  NameIndex bind_index; /* name -> index into bind */
  RepeatCounter *ctr;
  int nctr, cap_ctr;
  NameIndex ctr_index; /* block name -> index into ctr */
  const char *prefix; /* IR name prefix: "" at top level, "layer.3/" in a copy */
  int copy;           /* index of the copy within its repeat ({i}); -1 at top level */
} Scope;

typedef struct {
  const char *file; /* model path for locations; g->file once the graph exists */
  char *dir;        /* directory of the model file, for `weights:` */
  unsigned char *text;
  size_t text_size;
  yaml_document_t doc;
  bool have_doc;
  Graph *g;
  uint64_t seed;
  DType dtype;
  bool dtype_from_cli;
  Dim *dims;
  int ndims;
  NameIndex dim_index; /* name -> index into dims */
  /* the weights files, in the order the model lists them (one, a list, or
   * the files of a Hugging Face model.safetensors.index.json) */
  SafeTensors *weights[FE_MAX_WEIGHT_FILES];
  const char *weights_name[FE_MAX_WEIGHT_FILES]; /* as written in the YAML (or the index) */
  const char *weights_path[FE_MAX_WEIGHT_FILES]; /* as opened (graph arena): provenance of the params read */
  int nweights;
  yaml_node_t *blocks;      /* mapping, or NULL */
  const char *active[FE_MAX_DEPTH];
  int depth;
  int64_t const_bytes;
  /* parse_yaml's read handler */
  yaml_parser_t *parser;
  size_t fed;         /* bytes of text handed to libyaml */
  bool too_deep;      /* the handler stopped at FE_MAX_YAML_DEPTH */
  yaml_mark_t deep_at; /* where the scanner was then */
} Loader;

/* ---- name tables ---- */

static uint64_t name_hash(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return h;
}

/* The index stored for name, or -1. */
static int name_index_find(const NameIndex *ni, const char *name) {
  if (!ni->cap) return -1;
  size_t mask = (size_t)ni->cap - 1;
  for (size_t i = (size_t)name_hash(name) & mask;; i = (i + 1) & mask) {
    if (!ni->slot[i].name) return -1;
    if (!strcmp(ni->slot[i].name, name)) return ni->slot[i].index;
  }
}

static void name_index_put(NameSlot *slot, int cap, const char *name, int index) {
  size_t mask = (size_t)cap - 1, i = (size_t)name_hash(name) & mask;
  while (slot[i].name) i = (i + 1) & mask;
  slot[i].name = name;
  slot[i].index = index;
}

/* Adds name (not yet in ni) with index. */
static smelt_status name_index_add(NameIndex *ni, const char *name, int index) {
  if (2 * (ni->n + 1) > ni->cap) {
    int cap = ni->cap ? 2 * ni->cap : 64;
    NameSlot *slot = calloc((size_t)cap, sizeof *slot);
    if (!slot) return st_error(ST_NO_MEMORY, "out of memory");
    for (int i = 0; i < ni->cap; i++)
      if (ni->slot[i].name) name_index_put(slot, cap, ni->slot[i].name, ni->slot[i].index);
    free(ni->slot);
    ni->slot = slot;
    ni->cap = cap;
  }
  name_index_put(ni->slot, ni->cap, name, index);
  ni->n++;
  return NULL;
}

static void name_index_free(NameIndex *ni) {
  free(ni->slot);
  memset(ni, 0, sizeof *ni);
}

/* ---- the YAML tree ---- */

static yaml_node_t *node_at(Loader *L, int id) { return yaml_document_get_node(&L->doc, id); }

static SrcLoc loc_of(const Loader *L, const yaml_node_t *n) {
  SrcLoc loc = {L->file, 0, 0};
  if (n) {
    loc.line = (int)n->start_mark.line + 1;
    loc.col = (int)n->start_mark.column + 1;
  }
  return loc;
}

static int seq_len(const yaml_node_t *n) {
  return n ? (int)(n->data.sequence.items.top - n->data.sequence.items.start) : 0;
}
static yaml_node_t *seq_item(Loader *L, const yaml_node_t *n, int i) {
  return node_at(L, n->data.sequence.items.start[i]);
}
static int map_len(const yaml_node_t *n) {
  return n ? (int)(n->data.mapping.pairs.top - n->data.mapping.pairs.start) : 0;
}
static yaml_node_t *map_key(Loader *L, const yaml_node_t *n, int i) {
  return node_at(L, n->data.mapping.pairs.start[i].key);
}
static yaml_node_t *map_val(Loader *L, const yaml_node_t *n, int i) {
  return node_at(L, n->data.mapping.pairs.start[i].value);
}

static const char *sval(const yaml_node_t *n) { return (const char *)n->data.scalar.value; }
static bool is_scalar(const yaml_node_t *n) { return n && n->type == YAML_SCALAR_NODE; }
/* Only plain (unquoted) scalars can be numbers, booleans or null: "16" in
 * quotes is a string, as in every YAML schema. */
static bool is_plain(const yaml_node_t *n) {
  return is_scalar(n) && n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
}

static bool is_null(const yaml_node_t *n) {
  if (!is_plain(n)) return false;
  const char *s = sval(n);
  return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL");
}

static bool scalar_bool(const yaml_node_t *n, bool *out) {
  if (!is_plain(n)) return false;
  const char *s = sval(n);
  if (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "TRUE")) *out = true;
  else if (!strcmp(s, "false") || !strcmp(s, "False") || !strcmp(s, "FALSE")) *out = false;
  else return false;
  return true;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

/* A decimal integer [-+]?[0-9]+.  *overflow is set when it does not fit. */
static bool scalar_int(const yaml_node_t *n, int64_t *out, bool *overflow) {
  *overflow = false;
  if (!is_plain(n)) return false;
  const char *s = sval(n), *p = s;
  if (*p == '-' || *p == '+') p++;
  if (!*p) return false;
  for (const char *q = p; *q; q++)
    if (!is_digit(*q)) return false;
  errno = 0;
  long long v = strtoll(s, NULL, 10);
  if (errno == ERANGE) *overflow = true;
  *out = v;
  return true;
}

/* A YAML 1.2 core-schema float (1.0, -2.5e-3, .5, 1e6, .inf, -.inf, .nan)
 * or integer; strtod alone would also take "inf", "0x1p3" and " 1". */
static bool scalar_number(const yaml_node_t *n, double *out) {
  if (!is_plain(n)) return false;
  const char *s = sval(n), *p = s;
  bool neg = false;
  if (*p == '-' || *p == '+') neg = *p++ == '-';
  if (!strcmp(p, ".inf") || !strcmp(p, ".Inf") || !strcmp(p, ".INF")) {
    *out = neg ? -INFINITY : INFINITY;
    return true;
  }
  if (p == s && (!strcmp(p, ".nan") || !strcmp(p, ".NaN") || !strcmp(p, ".NAN"))) {
    *out = NAN;
    return true;
  }
  int nd = 0;
  while (is_digit(*p)) p++, nd++;
  if (*p == '.') {
    p++;
    while (is_digit(*p)) p++, nd++;
  }
  if (!nd) return false;
  if (*p == 'e' || *p == 'E') {
    p++;
    if (*p == '-' || *p == '+') p++;
    if (!is_digit(*p)) return false;
    while (is_digit(*p)) p++;
  }
  if (*p) return false;
  *out = strtod(s, NULL);
  return true;
}

/* A short rendering of any node for messages: [1, 2], {normal: 0.02}. */
typedef struct {
  char *buf;
  size_t cap, len;
  bool full;
} Sb;

static void sb_add(Sb *sb, const char *s) {
  if (sb->full) return;
  size_t n = strlen(s);
  if (sb->len + n + 4 > sb->cap) {
    size_t room = sb->cap - sb->len - 4;
    memcpy(sb->buf + sb->len, s, room);
    sb->len += room;
    memcpy(sb->buf + sb->len, "...", 4);
    sb->full = true;
    return;
  }
  memcpy(sb->buf + sb->len, s, n + 1);
  sb->len += n;
}

static void render_rec(Loader *L, Sb *sb, const yaml_node_t *n, int depth) {
  if (!n) return;
  if (depth > 4) { /* anchors may form cycles; the message needs no more */
    sb_add(sb, "...");
    return;
  }
  switch (n->type) {
  case YAML_SCALAR_NODE:
    if (is_plain(n)) {
      sb_add(sb, *sval(n) ? sval(n) : "null");
    } else {
      sb_add(sb, "\"");
      sb_add(sb, sval(n));
      sb_add(sb, "\"");
    }
    break;
  case YAML_SEQUENCE_NODE:
    sb_add(sb, "[");
    for (int i = 0; i < seq_len(n) && !sb->full; i++) {
      if (i) sb_add(sb, ", ");
      render_rec(L, sb, seq_item(L, n, i), depth + 1);
    }
    sb_add(sb, "]");
    break;
  case YAML_MAPPING_NODE:
    sb_add(sb, "{");
    for (int i = 0; i < map_len(n) && !sb->full; i++) {
      if (i) sb_add(sb, ", ");
      render_rec(L, sb, map_key(L, n, i), depth + 1);
      sb_add(sb, ": ");
      render_rec(L, sb, map_val(L, n, i), depth + 1);
    }
    sb_add(sb, "}");
    break;
  default: break;
  }
}

static const char *render(Loader *L, const yaml_node_t *n, char *buf, size_t cap) {
  Sb sb = {buf, cap, 0, false};
  buf[0] = 0;
  render_rec(L, &sb, n, 0);
  return buf;
}

static const char *kind_name(const yaml_node_t *n) {
  if (n->type == YAML_MAPPING_NODE) return "a mapping";
  if (n->type == YAML_SEQUENCE_NODE) return "a list";
  return "a scalar";
}

/* An error at node n (or, with n NULL, at the file as a whole). */
static smelt_status errf(Loader *L, const yaml_node_t *n, const char *fmt, ...) SMELT_PRINTF(3, 4);
static smelt_status errf(Loader *L, const yaml_node_t *n, const char *fmt, ...) {
  char body[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(body, sizeof body, fmt, ap);
  va_end(ap);
  return st_at(loc_of(L, n), "%s", body);
}

/* ---- typed access with located errors ---- */

/* `what` names the thing being read, for messages: "input 'x': shape". */
static smelt_status get_map(Loader *L, yaml_node_t *n, const char *what, yaml_node_t **out) {
  *out = NULL;
  if (!n || is_null(n)) return NULL; /* `params:` with nothing after it is an empty mapping */
  if (n->type != YAML_MAPPING_NODE) return errf(L, n, "%s must be a mapping, got %s", what, kind_name(n));
  *out = n;
  return NULL;
}

static smelt_status get_seq(Loader *L, yaml_node_t *n, const char *what, yaml_node_t **out) {
  *out = NULL;
  if (!n || is_null(n)) return NULL;
  if (n->type != YAML_SEQUENCE_NODE) return errf(L, n, "%s must be a list, got %s", what, kind_name(n));
  *out = n;
  return NULL;
}

/* Any non-null scalar without NUL bytes (a "\0" escape would cut it short). */
static smelt_status get_text(Loader *L, yaml_node_t *n, const char *what, const char **out) {
  char tmp[128];
  if (!is_scalar(n) || is_null(n)) return errf(L, n, "%s must be a string, got %s", what, render(L, n, tmp, sizeof tmp));
  if (strlen(sval(n)) != n->data.scalar.length) return errf(L, n, "%s contains a NUL character", what);
  *out = sval(n);
  return NULL;
}

/* A name of a value, dim, block or param: non-empty, and without '/', which
 * separates block copies in IR names. */
static smelt_status get_name(Loader *L, yaml_node_t *n, const char *what, const char **out) {
  RETURN_IF_ERROR(get_text(L, n, what, out));
  if (!**out) return errf(L, n, "%s must not be empty", what);
  if (strchr(*out, '/')) return errf(L, n, "%s '%s' must not contain '/'", what, *out);
  return NULL;
}

static smelt_status get_int(Loader *L, yaml_node_t *n, const char *what, int64_t *out) {
  char tmp[128];
  bool overflow;
  if (!scalar_int(n, out, &overflow)) return errf(L, n, "%s expects an integer, got %s", what, render(L, n, tmp, sizeof tmp));
  if (overflow) return errf(L, n, "%s: integer %s does not fit in 64 bits (dims overflow)", what, sval(n));
  return NULL;
}

static smelt_status get_number(Loader *L, yaml_node_t *n, const char *what, double *out) {
  char tmp[128];
  if (!scalar_number(n, out)) return errf(L, n, "%s expects a number, got %s", what, render(L, n, tmp, sizeof tmp));
  return NULL;
}

static const Dim *find_dim(const Loader *L, const char *name) {
  int i = name_index_find(&L->dim_index, name);
  if (i >= 0) return &L->dims[i];
  return NULL;
}

/* An integer, or a name from `dims` standing for one.  *ok is false (and no
 * error made) when n is neither a number nor a string, so callers can word
 * the type error for their context. */
static smelt_status get_int_or_dim(Loader *L, yaml_node_t *n, const char *what, int64_t *out, bool *ok) {
  bool overflow;
  *ok = true;
  if (scalar_int(n, out, &overflow)) {
    if (overflow) return errf(L, n, "%s: integer %s does not fit in 64 bits (dims overflow)", what, sval(n));
    return NULL;
  }
  if (is_scalar(n) && !is_null(n) && !scalar_number(n, &(double){0}) && strlen(sval(n)) == n->data.scalar.length) {
    const Dim *d = find_dim(L, sval(n));
    if (!d) return errf(L, n, "%s: unknown dim '%s'", what, sval(n));
    *out = d->value;
    return NULL;
  }
  *ok = false;
  return NULL;
}

static smelt_status get_size(Loader *L, yaml_node_t *n, const char *what, int64_t *out) {
  char tmp[128];
  bool ok;
  RETURN_IF_ERROR(get_int_or_dim(L, n, what, out, &ok));
  if (!ok) return errf(L, n, "%s expects a size (an integer or a dims name), got %s", what, render(L, n, tmp, sizeof tmp));
  return NULL;
}

static smelt_status get_dtype(Loader *L, yaml_node_t *n, const char *what, DType *out) {
  const char *s;
  RETURN_IF_ERROR(get_text(L, n, what, &s));
  *out = dt_from_name(s);
  if (*out == DT_INVALID) {
    char all[128] = "";
    for (int d = 1; d < DT_COUNT; d++) {
      strcat(all, d > 1 ? " " : "");
      strcat(all, dt_name((DType)d));
    }
    return errf(L, n, "%s: unknown dtype '%s' (expected one of %s)", what, s, all);
  }
  return NULL;
}

/* The i'th key of map: a string, not a duplicate of an earlier key (looked up
 * in *seen, which then gets it, or compared with each when seen is NULL) and,
 * when allowed is not NULL, one of allowed (a NULL-terminated list). */
static smelt_status check_key(Loader *L, yaml_node_t *map, int i, const char *const *allowed, const char *what,
                              NameIndex *seen) {
  yaml_node_t *k = map_key(L, map, i);
  const char *key;
  RETURN_IF_ERROR(get_text(L, k, "a key", &key));
  int first = seen ? name_index_find(seen, key) : -1;
  for (int j = 0; !seen && j < i && first < 0; j++)
    if (!strcmp(sval(map_key(L, map, j)), key)) first = j;
  if (first >= 0) {
    yaml_node_t *prev = map_key(L, map, first);
    return errf(L, k, "duplicate key '%s' in %s (first at %d:%d)", key, what, loc_of(L, prev).line,
                loc_of(L, prev).col);
  }
  if (seen) RETURN_IF_ERROR(name_index_add(seen, key, i));
  if (!allowed) return NULL;
  bool known = false;
  for (const char *const *a = allowed; *a; a++) known |= !strcmp(*a, key);
  if (!known) {
    char list[256] = "";
    for (const char *const *a = allowed; *a; a++) {
      if (strlen(list) + strlen(*a) + 3 >= sizeof list) break;
      strcat(list, a == allowed ? "" : ", ");
      strcat(list, *a);
    }
    return errf(L, k, "unknown key '%s' in %s (expected one of: %s)", key, what, list);
  }
  return NULL;
}

/* Checks every key of map (check_key).  A node's few keys are compared
 * pairwise; big mappings (inputs, params, blocks, dims) use a hash table. */
static smelt_status check_keys(Loader *L, yaml_node_t *map, const char *const *allowed, const char *what) {
  NameIndex seen = {0};
  smelt_status st = NULL;
  for (int i = 0; i < map_len(map) && !st; i++) st = check_key(L, map, i, allowed, what, map_len(map) > 16 ? &seen : NULL);
  name_index_free(&seen);
  return st;
}

/* The value of key in map (keys already checked to be scalars), or NULL. */
static yaml_node_t *map_find(Loader *L, yaml_node_t *map, const char *key) {
  for (int i = 0; i < map_len(map); i++)
    if (is_scalar(map_key(L, map, i)) && !strcmp(sval(map_key(L, map, i)), key)) return map_val(L, map, i);
  return NULL;
}

/* A name or a list of names: `out: h` or `out: [a, b]`. */
typedef struct {
  const char **name;
  yaml_node_t **node;
  int n;
} NameList;

static void names_free(NameList *nl) {
  free(nl->name);
  free(nl->node);
  memset(nl, 0, sizeof *nl);
}

static smelt_status get_names(Loader *L, yaml_node_t *n, const char *what, NameList *out) {
  memset(out, 0, sizeof *out);
  if (!n || is_null(n)) return NULL;
  int count = n->type == YAML_SEQUENCE_NODE ? seq_len(n) : 1;
  if (n->type == YAML_MAPPING_NODE) return errf(L, n, "%s must be a name or a list of names, got a mapping", what);
  if (count > FE_MAX_LIST) return errf(L, n, "%s has %d names, more than the limit of %d", what, count, FE_MAX_LIST);
  out->name = calloc((size_t)count + 1, sizeof *out->name);
  out->node = calloc((size_t)count + 1, sizeof *out->node);
  if (!out->name || !out->node) {
    names_free(out);
    return st_error(ST_NO_MEMORY, "out of memory");
  }
  for (int i = 0; i < count; i++) {
    yaml_node_t *item = n->type == YAML_SEQUENCE_NODE ? seq_item(L, n, i) : n;
    smelt_status st = get_name(L, item, what, &out->name[i]);
    if (st) {
      names_free(out);
      return st;
    }
    out->node[i] = item;
  }
  out->n = count;
  return NULL;
}

/* The first name of nl that repeats an earlier one (its index), or -1. */
static smelt_status names_first_repeat(const NameList *nl, int *out_index) {
  NameIndex seen = {0};
  smelt_status st = NULL;
  *out_index = -1;
  for (int i = 0; i < nl->n && !st && *out_index < 0; i++) {
    if (name_index_find(&seen, nl->name[i]) >= 0) *out_index = i;
    else st = name_index_add(&seen, nl->name[i], i);
  }
  name_index_free(&seen);
  return st;
}

/* ---- scopes ---- */

static const Binding *scope_find(const Scope *s, const char *name) {
  int i = name_index_find(&s->bind_index, name);
  return i >= 0 ? &s->bind[i] : NULL;
}

static smelt_status scope_check_free(Loader *L, const Scope *s, const char *name, yaml_node_t *at) {
  const Binding *b = scope_find(s, name);
  if (b) return errf(L, at, "duplicate name '%s' (first defined at %d:%d)", name, b->loc.line, b->loc.col);
  return NULL;
}

static smelt_status scope_bind(Loader *L, Scope *s, const char *name, int value, yaml_node_t *at) {
  RETURN_IF_ERROR(scope_check_free(L, s, name, at));
  if (s->nbind == s->cap_bind) {
    int cap = s->cap_bind ? 2 * s->cap_bind : 16;
    Binding *b = realloc(s->bind, sizeof *b * (size_t)cap);
    if (!b) return st_error(ST_NO_MEMORY, "out of memory");
    s->bind = b;
    s->cap_bind = cap;
  }
  RETURN_IF_ERROR(name_index_add(&s->bind_index, name, s->nbind));
  Binding *b = &s->bind[s->nbind++];
  b->name = name;
  b->value = value;
  b->loc = loc_of(L, at);
  return NULL;
}

/* The next copy number of block in scope s; advances it by times. */
static smelt_status scope_take_copies(Scope *s, const char *block, int times, int *out_first) {
  int i = name_index_find(&s->ctr_index, block);
  if (i >= 0) {
    *out_first = s->ctr[i].next;
    s->ctr[i].next += times;
    return NULL;
  }
  if (s->nctr == s->cap_ctr) {
    int cap = s->cap_ctr ? 2 * s->cap_ctr : 4;
    RepeatCounter *c = realloc(s->ctr, sizeof *c * (size_t)cap);
    if (!c) return st_error(ST_NO_MEMORY, "out of memory");
    s->ctr = c;
    s->cap_ctr = cap;
  }
  RETURN_IF_ERROR(name_index_add(&s->ctr_index, block, s->nctr));
  s->ctr[s->nctr].block = block;
  s->ctr[s->nctr].next = times;
  s->nctr++;
  *out_first = 0;
  return NULL;
}

static void scope_free(Scope *s) {
  free(s->bind);
  name_index_free(&s->bind_index);
  free(s->ctr);
  name_index_free(&s->ctr_index);
}

/* The IR name of a local name, in the graph's arena. */
static const char *ir_name(Loader *L, const Scope *s, const char *local) {
  return ir_graph_printf(L->g, "%s%s", s->prefix, local);
}

static const char *shape_str(int rank, const int64_t *dim, char *buf, size_t cap) {
  size_t k = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < rank && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, i ? ",%lld" : "%lld", (long long)dim[i]);
  if (k < cap) snprintf(buf + k, cap - k, "]");
  return buf;
}

/* ---- dims, shapes ---- */

static smelt_status load_dims(Loader *L, yaml_node_t *node, const FeOptions *opts) {
  yaml_node_t *map;
  RETURN_IF_ERROR(get_map(L, node, "dims", &map));
  RETURN_IF_ERROR(check_keys(L, map, NULL, "dims"));
  L->dims = calloc((size_t)map_len(map) + 1, sizeof *L->dims);
  if (!L->dims) return st_error(ST_NO_MEMORY, "out of memory");
  for (int i = 0; i < map_len(map); i++) {
    yaml_node_t *k = map_key(L, map, i), *v = map_val(L, map, i);
    Dim *d = &L->dims[L->ndims];
    RETURN_IF_ERROR(get_name(L, k, "dim name", &d->name));
    /* a numeric name could never be used: sizes that parse as integers are integers */
    if (scalar_number(k, &(double){0})) return errf(L, k, "dim name must be a name, got %s", d->name);
    char what[160];
    snprintf(what, sizeof what, "dim '%s'", d->name);
    if (v && v->type == YAML_MAPPING_NODE) {
      /* a range, `seq: {max: 2048}` (min 1 unless given): the model loads
       * at the max, and the compiler makes one program for the range */
      static const char *const range_keys[] = {"max", "min", NULL};
      RETURN_IF_ERROR(check_keys(L, v, range_keys, what));
      yaml_node_t *mx = map_find(L, v, "max"), *mn = map_find(L, v, "min");
      if (!mx) return errf(L, v, "%s: a range needs max, as in {max: 2048}", what);
      int64_t lo = 1;
      RETURN_IF_ERROR(get_int(L, mx, what, &d->value));
      if (mn) RETURN_IF_ERROR(get_int(L, mn, what, &lo));
      if (lo <= 0 || d->value < lo)
        return errf(L, v, "%s: the range %lld..%lld is empty or not positive", what, (long long)lo, (long long)d->value);
      if (L->g->nranges == IR_MAX_RANGES) return errf(L, v, "%s: more than %d ranged dims", what, IR_MAX_RANGES);
      if (lo < d->value)
        L->g->ranges[L->g->nranges++] = (IrRange){.name = ir_graph_strdup(L->g, d->name), .min = lo, .max = d->value};
    } else {
      RETURN_IF_ERROR(get_int(L, v, what, &d->value));
    }
    if (d->value <= 0) return errf(L, v, "dim '%s' must be positive, got %lld", d->name, (long long)d->value);
    RETURN_IF_ERROR(name_index_add(&L->dim_index, d->name, L->ndims));
    L->ndims++;
  }
  for (int i = 0; opts && i < opts->ndims; i++) {
    SrcLoc file = {L->file, 0, 0};
    const FeDim *o = &opts->dims[i];
    int at = name_index_find(&L->dim_index, o->name);
    Dim *d = at >= 0 ? &L->dims[at] : NULL;
    if (!d) {
      char have[256] = "";
      for (int j = 0; j < L->ndims && strlen(have) + strlen(L->dims[j].name) + 3 < sizeof have; j++) {
        strcat(have, j ? ", " : "");
        strcat(have, L->dims[j].name);
      }
      return st_at(file, "--dim %s: the model has no dim '%s' (its dims: %s)", o->name, o->name,
                   L->ndims ? have : "none");
    }
    if (o->value <= 0)
      return st_at(file, "--dim %s=%lld: a dim must be positive", o->name, (long long)o->value);
    d->value = o->value;
    /* an exact value replaces a range the model declares (the compiler
     * passes ranges of its own as the value it loads at) */
    for (int r = 0; r < L->g->nranges; r++)
      if (strcmp(L->g->ranges[r].name, o->name) == 0) {
        L->g->ranges[r] = L->g->ranges[--L->g->nranges];
        break;
      }
  }
  return NULL;
}

/* Fills t->rank and t->dim from a shape list; t->dt must be set, since the
 * byte count is what must not overflow. */
static smelt_status get_shape(Loader *L, yaml_node_t *n, const char *what, TensorType *t) {
  char w[200];
  snprintf(w, sizeof w, "%s: shape", what);
  yaml_node_t *seq;
  if (is_null(n)) return errf(L, n, "%s must be a list of sizes, got null", w);
  RETURN_IF_ERROR(get_seq(L, n, w, &seq));
  if (seq_len(seq) > IR_MAX_RANK)
    return errf(L, n, "%s has rank %d, more than the maximum of %d", w, seq_len(seq), IR_MAX_RANK);
  t->rank = seq_len(seq);
  int64_t bytes = (int64_t)dt_size(t->dt);
  bool overflow = false;
  for (int i = 0; i < t->rank; i++) {
    yaml_node_t *item = seq_item(L, seq, i);
    RETURN_IF_ERROR(get_size(L, item, w, &t->dim[i]));
    if (t->dim[i] <= 0) return errf(L, item, "%s: size must be positive, got %lld", w, (long long)t->dim[i]);
    if (bytes > INT64_MAX / t->dim[i]) overflow = true;
    else bytes *= t->dim[i];
  }
  if (overflow) {
    char tmp[200];
    return errf(L, n, "%s: dims overflow: %s %s has more than 2^63 bytes", w, dt_name(t->dt),
                shape_str(t->rank, t->dim, tmp, sizeof tmp));
  }
  return NULL;
}

/* ---- inputs and params ---- */

static const char *const input_keys[] = {"shape", "dtype", NULL};
static const char *const param_keys[] = {"shape", "dtype", "init", "value", "from", NULL};

/* `inputs:` and `state:` (top level or in a block): tensors declared by
 * shape and dtype.  State tensors belong to a session, are zero at
 * creation and persist across runs (SPEC §2); their bytes count against
 * the same limit as constants. */
static smelt_status load_tensor_decls(Loader *L, Scope *s, yaml_node_t *node, bool state) {
  const char *section = state ? "state" : "inputs", *kind = state ? "state" : "input";
  yaml_node_t *map;
  RETURN_IF_ERROR(get_map(L, node, section, &map));
  RETURN_IF_ERROR(check_keys(L, map, NULL, section));
  for (int i = 0; i < map_len(map); i++) {
    yaml_node_t *k = map_key(L, map, i), *spec = map_val(L, map, i);
    const char *name;
    char what[160];
    snprintf(what, sizeof what, "%s name", kind);
    RETURN_IF_ERROR(get_name(L, k, what, &name));
    snprintf(what, sizeof what, "%s '%s'", kind, name);
    if (spec->type != YAML_MAPPING_NODE) return errf(L, spec, "%s must be a mapping like {shape: [...]}", what);
    RETURN_IF_ERROR(check_keys(L, spec, input_keys, what));
    TensorType t;
    memset(&t, 0, sizeof t);
    t.dt = L->dtype;
    if (map_find(L, spec, "dtype")) RETURN_IF_ERROR(get_dtype(L, map_find(L, spec, "dtype"), what, &t.dt));
    if (!map_find(L, spec, "shape")) return errf(L, spec, "%s needs a shape", what);
    RETURN_IF_ERROR(get_shape(L, map_find(L, spec, "shape"), what, &t));
    if (state) {
      int64_t bytes = (int64_t)ir_type_bytes(&t);
      if (bytes > FE_MAX_CONST_BYTES || L->const_bytes + bytes > FE_MAX_TOTAL_CONST_BYTES)
        return errf(L, map_find(L, spec, "shape"), "%s: %lld bytes is more than smelt keeps for a session's state",
                    what, (long long)bytes);
      L->const_bytes += bytes;
    }
    RETURN_IF_ERROR(scope_check_free(L, s, name, k));
    const char *full = ir_name(L, s, name);
    int id = state ? ir_add_state(L->g, full, t, loc_of(L, k)) : ir_add_input(L->g, full, t, loc_of(L, k));
    RETURN_IF_ERROR(scope_bind(L, s, name, id, k));
  }
  return NULL;
}

static uint64_t fnv1a64(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return h;
}

static uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double unit_draw(uint64_t *state) { return (double)(splitmix64(state) >> 11) * 0x1.0p-53; }

static void fill_constant(const TensorType *t, void *data, double v) {
  int64_t n = ir_type_numel(t);
  for (int64_t i = 0; i < n; i++) dt_store(t->dt, data, (size_t)i, v);
}

static smelt_status param_init(Loader *L, yaml_node_t *n, const char *pname, const TensorType *t, void *data,
                               const char **desc) {
  char tmp[128], what[200];
  if (is_scalar(n) && !strcmp(sval(n), "zeros")) {
    *desc = "zeros"; /* ir_add_const zero-filled it */
    return NULL;
  }
  if (is_scalar(n) && !strcmp(sval(n), "ones")) {
    fill_constant(t, data, 1.0);
    *desc = "ones";
    return NULL;
  }
  if (!n || n->type != YAML_MAPPING_NODE || map_len(n) != 1 || !is_scalar(map_key(L, n, 0)) ||
      (strcmp(sval(map_key(L, n, 0)), "normal") && strcmp(sval(map_key(L, n, 0)), "uniform")))
    return errf(L, n, "param '%s': unknown init %s (expected zeros, ones, {normal: STD} or {uniform: [LO, HI]})",
                pname, render(L, n, tmp, sizeof tmp));
  const char *kind = sval(map_key(L, n, 0));
  yaml_node_t *arg = map_val(L, n, 0);
  if (!dt_is_float(t->dt))
    return errf(L, n, "param '%s': init %s needs a float dtype, the param is %s", pname, kind, dt_name(t->dt));
  uint64_t state = L->seed ^ fnv1a64(pname);
  int64_t count = ir_type_numel(t);
  snprintf(what, sizeof what, "param '%s': %s", pname, kind);
  if (!strcmp(kind, "normal")) {
    double std;
    RETURN_IF_ERROR(get_number(L, arg, what, &std));
    if (!(std >= 0) || isinf(std)) return errf(L, arg, "%s: std must be finite and >= 0, got %s", what, sval(arg));
    for (int64_t i = 0; i < count; i += 2) {
      double u1 = 1.0 - unit_draw(&state), u2 = unit_draw(&state);
      double r = sqrt(-2.0 * log(u1)), a = 6.283185307179586 * u2; /* 2 pi */
      dt_store(t->dt, data, (size_t)i, std * r * cos(a));
      if (i + 1 < count) dt_store(t->dt, data, (size_t)i + 1, std * r * sin(a));
    }
    *desc = ir_graph_printf(L->g, "normal(%g)", std);
    return NULL;
  }
  yaml_node_t *lohi;
  RETURN_IF_ERROR(get_seq(L, arg, what, &lohi));
  double lo, hi;
  if (seq_len(lohi) != 2) return errf(L, arg, "%s expects [LO, HI], got %s", what, render(L, arg, tmp, sizeof tmp));
  RETURN_IF_ERROR(get_number(L, seq_item(L, lohi, 0), what, &lo));
  RETURN_IF_ERROR(get_number(L, seq_item(L, lohi, 1), what, &hi));
  if (!(lo <= hi) || isinf(lo) || isinf(hi))
    return errf(L, arg, "%s: need finite LO <= HI, got %s", what, render(L, arg, tmp, sizeof tmp));
  for (int64_t i = 0; i < count; i++) dt_store(t->dt, data, (size_t)i, lo + (hi - lo) * unit_draw(&state));
  *desc = ir_graph_printf(L->g, "uniform(%g,%g)", lo, hi);
  return NULL;
}

/* Stores one element of a `value:` list, checked against the dtype: floats
 * take any number, integers an integer in range, bool true/false (or 0/1). */
static smelt_status store_elem(Loader *L, yaml_node_t *n, const char *pname, DType dt, void *data, int64_t i) {
  char tmp[128];
  bool b, overflow;
  int64_t iv;
  double fv;
  if (dt_is_float(dt) || dt_is_f8(dt)) {
    if (!scalar_number(n, &fv)) goto bad;
    dt_store(dt, data, (size_t)i, fv);
    return NULL;
  }
  if (dt == DT_BOOL) {
    if (scalar_bool(n, &b)) iv = b;
    else if (!scalar_int(n, &iv, &overflow) || (iv != 0 && iv != 1)) goto bad;
    dt_store(dt, data, (size_t)i, (double)iv);
    return NULL;
  }
  if (!scalar_int(n, &iv, &overflow) || overflow) goto bad;
  int64_t lo = dt == DT_I32 ? INT32_MIN : dt == DT_I8 ? -128 : dt == DT_U8 || dt == DT_U4 ? 0 : dt == DT_I4 ? -8 : INT64_MIN;
  int64_t hi = dt == DT_I32 ? INT32_MAX : dt == DT_I8 ? 127 : dt == DT_U8 ? 255 : dt == DT_I4 ? 7 : dt == DT_U4 ? 15 : INT64_MAX;
  if (iv < lo || iv > hi) goto bad;
  if (dt == DT_I64) memcpy((int64_t *)data + i, &iv, sizeof iv); /* exact beyond 2^53 */
  else dt_store(dt, data, (size_t)i, (double)iv);
  return NULL;
bad:
  return errf(L, n, "param '%s': value %s is not a valid %s", pname, render(L, n, tmp, sizeof tmp), dt_name(dt));
}

static smelt_status fill_value(Loader *L, yaml_node_t *n, const char *pname, const TensorType *t, int axis,
                               void *data, int64_t *pos) {
  char tmp[200];
  if (axis == t->rank) return store_elem(L, n, pname, t->dt, data, (*pos)++);
  if (!n || n->type != YAML_SEQUENCE_NODE || seq_len(n) != t->dim[axis])
    return errf(L, n, "param '%s': value does not match shape %s: expected a list of %lld at depth %d, got %s",
                pname, shape_str(t->rank, t->dim, tmp, 100), (long long)t->dim[axis], axis + 1,
                render(L, n, tmp + 100, 100));
  for (int i = 0; i < seq_len(n); i++) RETURN_IF_ERROR(fill_value(L, seq_item(L, n, i), pname, t, axis + 1, data, pos));
  return NULL;
}

static smelt_status param_value(Loader *L, yaml_node_t *n, const char *pname, const TensorType *t, void *data) {
  if (is_scalar(n)) { /* one scalar broadcast to the whole shape */
    RETURN_IF_ERROR(store_elem(L, n, pname, t->dt, data, 0));
    int64_t count = ir_type_numel(t);
    size_t es = dt_size(t->dt);
    for (int64_t i = 1; i < count; i++) memcpy((char *)data + (size_t)i * es, data, es);
    return NULL;
  }
  int64_t pos = 0;
  return fill_value(L, n, pname, t, 0, data, &pos);
}

/* "layers.{i}.wo" with copy 3 becomes "layers.3.wo". */
static smelt_status subst_index(Loader *L, const Scope *s, yaml_node_t *at, const char *name, const char **out) {
  if (!strstr(name, "{i}")) {
    *out = name;
    return NULL;
  }
  if (s->copy < 0) return errf(L, at, "'{i}' in '%s' is only meaningful inside a repeated block", name);
  size_t n = strlen(name) + 1;
  for (const char *p = name; (p = strstr(p, "{i}")); p += 3) n += 8; /* copy < 10^8 */
  char *buf = arena_alloc(&L->g->arena, n);
  if (!buf) return st_error(ST_NO_MEMORY, "out of memory");
  size_t k = 0;
  for (const char *p = name; *p;) {
    if (!strncmp(p, "{i}", 3)) {
      k += (size_t)snprintf(buf + k, n - k, "%d", s->copy);
      p += 3;
    } else {
      buf[k++] = *p++;
    }
  }
  buf[k] = 0;
  *out = buf;
  return NULL;
}

/* A param read from the weights file: its bytes are the file's, and its
 * provenance (Value.source) says where (--external-weights). */
static smelt_status param_from(Loader *L, const Scope *s, yaml_node_t *n, const char *pname, const TensorType *t,
                               bool dtype_explicit, void *data, const char **desc, const IrSource **out_src) {
  const char *raw = NULL, *tname = NULL;
  char what[200];
  snprintf(what, sizeof what, "param '%s': from", pname);
  RETURN_IF_ERROR(get_text(L, n, what, &raw));
  RETURN_IF_ERROR(subst_index(L, s, n, raw, &tname));
  if (!L->nweights)
    return errf(L, n, "param '%s': 'from: %s' needs a weights file (add 'weights: FILE.safetensors' at the top level)",
                pname, tname);
  const SafeTensor *w = NULL;
  int wf = 0;
  for (; wf < L->nweights && !w; wf++) w = fe_safetensors_find(L->weights[wf], tname);
  wf--;
  if (!w && L->nweights == 1)
    return errf(L, n, "param '%s': tensor '%s' is not in weights file '%s'", pname, tname, L->weights_name[0]);
  if (!w) return errf(L, n, "param '%s': tensor '%s' is in none of the %d weights files", pname, tname, L->nweights);
  char have[160], want[160];
  shape_str(w->rank, w->dim, have, sizeof have);
  shape_str(t->rank, t->dim, want, sizeof want);
  bool same_shape = w->rank == t->rank && !memcmp(w->dim, t->dim, sizeof(int64_t) * (size_t)t->rank);
  if (w->dt == DT_INVALID)
    return errf(L, n, "param '%s': weights file has %s %s, a dtype smelt does not support (model says %s %s)", pname,
                w->st_dtype, have, dt_name(t->dt), want);
  /* --dtype retypes a model whose params have no dtype of their own; float
   * weights then convert (rounding to nearest even), as the user asked. */
  bool convert = w->dt != t->dt && !dtype_explicit && L->dtype_from_cli && dt_is_float(w->dt) && dt_is_float(t->dt);
  if (!same_shape || (w->dt != t->dt && !convert))
    return errf(L, n, "param '%s': weights file has %s %s, model says %s %s", pname, w->st_dtype, have,
                dt_name(t->dt), want);
  if (!convert) {
    fmt_parallel_copy(data, w->data, w->nbytes);
    IrSource *src = arena_alloc(&L->g->arena, sizeof *src);
    IrCopy *cp = arena_alloc(&L->g->arena, sizeof *cp);
    if (!src || !cp) return st_error(ST_NO_MEMORY, "out of memory");
    *cp = (IrCopy){.file = L->weights_path[wf], .name = L->weights_name[wf], .src = w->offset, .rows = 1, .cols = 1,
                   .elem = w->nbytes};
    src->ncopies = 1;
    src->copies = cp;
    *out_src = src;
  } else {
    /* the file's data may be unaligned: copy before typed access */
    void *tmp = malloc(w->nbytes ? w->nbytes : 1);
    if (!tmp) return st_error(ST_NO_MEMORY, "out of memory");
    memcpy(tmp, w->data, w->nbytes);
    int64_t count = ir_type_numel(t);
    for (int64_t i = 0; i < count; i++) dt_store(t->dt, data, (size_t)i, dt_load(w->dt, tmp, (size_t)i));
    free(tmp);
  }
  *desc = ir_graph_printf(L->g, "from(%s)", tname);
  return NULL;
}

static smelt_status load_param(Loader *L, Scope *s, yaml_node_t *k, yaml_node_t *v) {
  const char *name;
  RETURN_IF_ERROR(get_name(L, k, "param name", &name));
  const char *full = ir_name(L, s, name);
  char what[200];
  snprintf(what, sizeof what, "param '%s'", full);
  if (v->type != YAML_MAPPING_NODE) return errf(L, v, "%s must be a mapping like {shape: [...], init: zeros}", what);
  RETURN_IF_ERROR(check_keys(L, v, param_keys, what));
  TensorType t;
  memset(&t, 0, sizeof t);
  t.dt = L->dtype;
  yaml_node_t *ndt = map_find(L, v, "dtype");
  if (ndt) RETURN_IF_ERROR(get_dtype(L, ndt, what, &t.dt));
  if (!map_find(L, v, "shape")) return errf(L, v, "%s needs a shape", what);
  RETURN_IF_ERROR(get_shape(L, map_find(L, v, "shape"), what, &t));
  yaml_node_t *src[3] = {map_find(L, v, "init"), map_find(L, v, "value"), map_find(L, v, "from")};
  int nsrc = (src[0] != NULL) + (src[1] != NULL) + (src[2] != NULL);
  if (nsrc != 1)
    return errf(L, v, "%s needs exactly one of init, value or from (it has %d)", what, nsrc);
  RETURN_IF_ERROR(scope_check_free(L, s, name, k));
  int64_t bytes = (int64_t)ir_type_bytes(&t);
  if (bytes > FE_MAX_CONST_BYTES || L->const_bytes + bytes > FE_MAX_TOTAL_CONST_BYTES)
    return errf(L, map_find(L, v, "shape"), "%s: %lld bytes is more than smelt keeps in memory for constants", what,
                (long long)bytes);
  L->const_bytes += bytes;
  int id = ir_add_const(L->g, full, t, NULL, loc_of(L, k));
  void *data = L->g->val[id].data;
  if (!data) return ir_graph_status(L->g);
  const char *desc = "value";
  if (src[0]) RETURN_IF_ERROR(param_init(L, src[0], full, &t, data, &desc));
  else if (src[1]) RETURN_IF_ERROR(param_value(L, src[1], full, &t, data));
  else RETURN_IF_ERROR(param_from(L, s, src[2], full, &t, ndt != NULL, data, &desc, &L->g->val[id].source));
  L->g->val[id].init = desc;
  return scope_bind(L, s, name, id, k);
}

static smelt_status load_params(Loader *L, Scope *s, yaml_node_t *node, const char *what) {
  yaml_node_t *map;
  RETURN_IF_ERROR(get_map(L, node, what, &map));
  RETURN_IF_ERROR(check_keys(L, map, NULL, what));
  for (int i = 0; i < map_len(map); i++) RETURN_IF_ERROR(load_param(L, s, map_key(L, map, i), map_val(L, map, i)));
  return NULL;
}

/* ---- nodes ---- */

static smelt_status load_nodes(Loader *L, Scope *s, yaml_node_t *seq);

/* Parses one attribute value against its schema entry and sets it. */
static smelt_status load_attr(Loader *L, int node, const char *nname, Op op, const AttrSpec *sp, yaml_node_t *v) {
  char tmp[160], what[200];
  const char *opname = ir_op_name(op);
  snprintf(what, sizeof what, "node '%s': attribute '%s' of %s", nname, sp->name, opname);
  static const char *const type_names[] = {"int", "float", "bool", "ints", "dtype", "enum"};
  bool ok, b;
  int64_t iv;
  double fv;
  switch (sp->type) {
  case AT_INT:
    RETURN_IF_ERROR(get_int_or_dim(L, v, what, &iv, &ok));
    if (!ok) break;
    ir_set_attr_int(L->g, node, sp->name, iv);
    return NULL;
  case AT_FLOAT:
    if (!scalar_number(v, &fv)) break;
    ir_set_attr_float(L->g, node, sp->name, fv);
    return NULL;
  case AT_BOOL:
    if (!scalar_bool(v, &b)) break;
    ir_set_attr_bool(L->g, node, sp->name, b);
    return NULL;
  case AT_INTS: {
    if (v->type != YAML_SEQUENCE_NODE) break;
    int n = seq_len(v);
    if (n > FE_MAX_LIST) return errf(L, v, "%s has %d elements, more than the limit of %d", what, n, FE_MAX_LIST);
    int64_t *vals = malloc(sizeof *vals * (size_t)(n ? n : 1));
    if (!vals) return st_error(ST_NO_MEMORY, "out of memory");
    for (int i = 0; i < n; i++) {
      yaml_node_t *item = seq_item(L, v, i);
      smelt_status st = get_int_or_dim(L, item, what, &vals[i], &ok);
      if (!st && !ok)
        st = errf(L, item, "%s expects ints, got %s (element %s is not an integer or a dims name)", what,
                  render(L, v, tmp, sizeof tmp), render(L, item, tmp + 80, 80));
      if (st) {
        free(vals);
        return st;
      }
    }
    ir_set_attr_ints(L->g, node, sp->name, vals, n);
    free(vals);
    return NULL;
  }
  case AT_DTYPE: {
    DType dt;
    if (!is_scalar(v) || is_null(v)) break;
    RETURN_IF_ERROR(get_dtype(L, v, what, &dt));
    ir_set_attr_dtype(L->g, node, sp->name, dt);
    return NULL;
  }
  case AT_ENUM: {
    if (!is_scalar(v) || is_null(v)) break;
    const char *w = sval(v), *words = sp->enum_words;
    size_t wl = strlen(w);
    for (const char *p = words; *p;) {
      const char *e = strchr(p, '|');
      size_t len = e ? (size_t)(e - p) : strlen(p);
      if (len == wl && !strncmp(p, w, len)) {
        ir_set_attr_enum(L->g, node, sp->name, w);
        return NULL;
      }
      p += len + (e ? 1 : 0);
    }
    return errf(L, v, "%s expects one of %s, got %s", what, words, render(L, v, tmp, sizeof tmp));
  }
  }
  if (sp->type == AT_ENUM)
    return errf(L, v, "%s expects one of %s, got %s", what, sp->enum_words, render(L, v, tmp, sizeof tmp));
  return errf(L, v, "%s expects %s, got %s", what, type_names[sp->type], render(L, v, tmp, sizeof tmp));
}

static bool op_has_attr(Op op, const char *name, AttrSpec *out) {
  int na = ir_op_attr_count(op);
  for (int i = 0; i < na; i++) {
    ir_op_attr_spec(op, i, out);
    if (!strcmp(out->name, name)) return true;
  }
  return false;
}

/* Resolves the names of `in` in scope s into value ids (malloc'd). */
static smelt_status resolve_inputs(Loader *L, const Scope *s, const NameList *in, const char *nname, const char *kind,
                                   int **out) {
  *out = malloc(sizeof(int) * (size_t)(in->n ? in->n : 1));
  if (!*out) return st_error(ST_NO_MEMORY, "out of memory");
  for (int i = 0; i < in->n; i++) {
    const Binding *b = scope_find(s, in->name[i]);
    if (!b) {
      free(*out);
      *out = NULL;
      if (s->prefix[0] && ir_find_value(L->g, in->name[i]) >= 0)
        return errf(L, in->node[i],
                    "node '%s' (%s): undefined name '%s' in this block: a block sees only its own inputs, params and "
                    "state; pass the model's '%s' to the block as one of its inputs",
                    nname, kind, in->name[i], in->name[i]);
      return errf(L, in->node[i], "node '%s' (%s): undefined name '%s'", nname, kind, in->name[i]);
    }
    (*out)[i] = b->value;
  }
  return NULL;
}

/* Output names must be new in the scope and distinct from each other. */
static smelt_status check_out_names(Loader *L, const Scope *s, const NameList *out) {
  int repeat;
  RETURN_IF_ERROR(names_first_repeat(out, &repeat));
  for (int i = 0; i < out->n; i++) {
    RETURN_IF_ERROR(scope_check_free(L, s, out->name[i], out->node[i]));
    if (i == repeat) return errf(L, out->node[i], "duplicate name '%s' in 'out'", out->name[i]);
  }
  return NULL;
}

static smelt_status load_op_node(Loader *L, Scope *s, yaml_node_t *n, const NameList *out, const char *nname) {
  yaml_node_t *vop = map_find(L, n, "op"), *vin = map_find(L, n, "in");
  const char *opname;
  RETURN_IF_ERROR(get_text(L, vop, "op", &opname));
  Op op = ir_op_from_name(opname);
  if (op == OP_COUNT) return errf(L, vop, "node '%s': unknown op '%s'", nname, opname);
  const OpInfo *info = ir_op_info(op);

  /* every key other than out/op/in must be an attribute of this op */
  AttrSpec sp;
  for (int i = 0; i < map_len(n); i++) {
    yaml_node_t *k = map_key(L, n, i);
    const char *key = sval(k);
    if (!strcmp(key, "out") || !strcmp(key, "op") || !strcmp(key, "in") || op_has_attr(op, key, &sp)) continue;
    char list[256] = "";
    int na = ir_op_attr_count(op);
    for (int a = 0; a < na; a++) {
      ir_op_attr_spec(op, a, &sp);
      if (strlen(list) + strlen(sp.name) + 3 >= sizeof list) break;
      strcat(list, a ? ", " : "");
      strcat(list, sp.name);
    }
    if (!strcmp(key, "repeat") || !strcmp(key, "times"))
      return errf(L, k, "node '%s' (%s): '%s' belongs to a repeat node, which has no 'op'", nname, opname, key);
    return errf(L, k, "node '%s' (%s): unknown key '%s' (%s%s)", nname, opname, key,
                na ? "attributes of the op: " : "the op takes no attributes", list);
  }

  NameList in;
  RETURN_IF_ERROR(get_names(L, vin, "in", &in));
  int *ins = NULL;
  smelt_status st = resolve_inputs(L, s, &in, nname, opname, &ins);
  if (!st && (in.n < info->min_in || in.n > info->max_in)) {
    if (info->min_in == info->max_in)
      st = errf(L, vin ? vin : n, "node '%s' (%s): takes %d input%s, got %d", nname, opname, info->min_in,
                info->min_in == 1 ? "" : "s", in.n);
    else
      st = errf(L, vin ? vin : n, "node '%s' (%s): takes %d to %d inputs, got %d", nname, opname, info->min_in,
                info->max_in, in.n);
  }
  int nout = info->nout < 0 ? out->n : info->nout;
  if (!st && out->n != nout)
    st = errf(L, map_find(L, n, "out"), "node '%s' (%s): has %d output%s but 'out' names %d", nname, opname, nout,
              nout == 1 ? "" : "s", out->n);
  if (!st) st = check_out_names(L, s, out);
  if (!st && L->g->nnode >= FE_MAX_NODES)
    st = errf(L, n, "the model has more than %d nodes", FE_MAX_NODES);
  if (st) {
    free(ins);
    names_free(&in);
    return st;
  }

  const char **irnames = malloc(sizeof *irnames * (size_t)nout);
  if (!irnames) {
    free(ins);
    names_free(&in);
    return st_error(ST_NO_MEMORY, "out of memory");
  }
  for (int i = 0; i < nout; i++) irnames[i] = ir_name(L, s, out->name[i]);
  int id = ir_add_node(L->g, op, in.n, ins, nout, irnames, loc_of(L, n));
  free(irnames);
  free(ins);
  names_free(&in);

  for (int i = 0; i < map_len(n); i++) {
    const char *key = sval(map_key(L, n, i));
    if (op_has_attr(op, key, &sp)) RETURN_IF_ERROR(load_attr(L, id, nname, op, &sp, map_val(L, n, i)));
  }
  int na = ir_op_attr_count(op);
  for (int a = 0; a < na; a++) {
    ir_op_attr_spec(op, a, &sp);
    if (sp.required && !ir_attr(&L->g->node[id], sp.name))
      return errf(L, n, "node '%s' (%s): missing required attribute '%s'", nname, opname, sp.name);
  }
  ir_fill_default_attrs(L->g, id);
  RETURN_IF_ERROR(ir_infer_node(L->g, id));
  for (int i = 0; i < nout; i++) RETURN_IF_ERROR(scope_bind(L, s, out->name[i], L->g->node[id].out[i], out->node[i]));
  return NULL;
}

static const char *const repeat_keys[] = {"out", "repeat", "times", "in", NULL};
static const char *const block_keys[] = {"inputs", "params", "state", "nodes", "outputs", NULL};

/* One copy of a block: binds its inputs to in_vals, instantiates its params
 * and nodes in a fresh scope, and returns its outputs in out_vals. */
static smelt_status instantiate_block(Loader *L, const Scope *s, const char *bname, yaml_node_t *block, int number,
                                      int copy, const int *in_vals, int *out_vals) {
  Scope cs;
  memset(&cs, 0, sizeof cs);
  cs.prefix = ir_graph_printf(L->g, "%s%s.%d/", s->prefix, bname, number);
  cs.copy = copy;
  if (!cs.prefix) return st_error(ST_NO_MEMORY, "out of memory");
  yaml_node_t *bin = map_find(L, block, "inputs"), *bout = map_find(L, block, "outputs");
  smelt_status st = NULL;
  for (int i = 0; i < seq_len(bin) && !st; i++)
    st = scope_bind(L, &cs, sval(seq_item(L, bin, i)), in_vals[i], seq_item(L, bin, i));
  if (!st) st = load_params(L, &cs, map_find(L, block, "params"), "block params");
  if (!st) st = load_tensor_decls(L, &cs, map_find(L, block, "state"), true);
  if (!st) st = load_nodes(L, &cs, map_find(L, block, "nodes"));
  for (int i = 0; i < seq_len(bout) && !st; i++) {
    yaml_node_t *o = seq_item(L, bout, i);
    const Binding *b = scope_find(&cs, sval(o));
    if (!b) st = errf(L, o, "block '%s': output '%s' is not defined in the block", bname, sval(o));
    else out_vals[i] = b->value;
  }
  scope_free(&cs);
  return st;
}

static smelt_status load_repeat_node(Loader *L, Scope *s, yaml_node_t *n, const NameList *out, const char *nname) {
  char what[200];
  snprintf(what, sizeof what, "repeat node '%s'", nname);
  RETURN_IF_ERROR(check_keys(L, n, repeat_keys, what));
  yaml_node_t *vrep = map_find(L, n, "repeat"), *vtimes = map_find(L, n, "times"), *vin = map_find(L, n, "in");
  const char *bname;
  RETURN_IF_ERROR(get_name(L, vrep, "repeat", &bname));
  yaml_node_t *block = map_find(L, L->blocks, bname);
  if (!block) return errf(L, vrep, "%s: unknown block '%s'", what, bname);
  int64_t times = 1;
  if (vtimes) {
    char w[240];
    snprintf(w, sizeof w, "%s: times", what);
    RETURN_IF_ERROR(get_size(L, vtimes, w, &times));
    if (times <= 0) return errf(L, vtimes, "%s: times must be positive, got %lld", what, (long long)times);
    if (times > FE_MAX_TIMES)
      return errf(L, vtimes, "%s: times %lld is more than the limit of %d", what, (long long)times, FE_MAX_TIMES);
  }
  for (int d = 0; d < L->depth; d++)
    if (!strcmp(L->active[d], bname)) return errf(L, vrep, "%s: block '%s' repeats itself", what, bname);
  if (L->depth >= FE_MAX_DEPTH) return errf(L, vrep, "%s: repeats nest more than %d deep", what, FE_MAX_DEPTH);

  yaml_node_t *bin = map_find(L, block, "inputs"), *bout = map_find(L, block, "outputs");
  int nbin = seq_len(bin), nbout = seq_len(bout);
  NameList in;
  RETURN_IF_ERROR(get_names(L, vin, "in", &in));
  int *cur = NULL, *res = calloc((size_t)nbout + 1, sizeof(int));
  smelt_status st = res ? resolve_inputs(L, s, &in, nname, bname, &cur) : st_error(ST_NO_MEMORY, "out of memory");
  if (!st && in.n != nbin)
    st = errf(L, vin ? vin : n, "%s: block '%s' takes %d input%s, got %d", what, bname, nbin, nbin == 1 ? "" : "s", in.n);
  if (!st && out->n != nbout)
    st = errf(L, map_find(L, n, "out"), "%s: block '%s' has %d output%s but 'out' names %d", what, bname, nbout,
              nbout == 1 ? "" : "s", out->n);
  if (!st && times > 1 && nbout > nbin)
    st = errf(L, vtimes, "%s: block '%s' has %d outputs but only %d inputs, so its copies cannot be chained", what,
              bname, nbout, nbin);
  if (!st) st = check_out_names(L, s, out);
  int first = 0;
  if (!st) st = scope_take_copies(s, bname, (int)times, &first);
  if (!st) {
    L->active[L->depth++] = bname;
    for (int c = 0; c < times && !st; c++) {
      st = instantiate_block(L, s, bname, block, first + c, c, cur, res);
      /* the k outputs of this copy are the first k inputs of the next */
      for (int k = 0; k < nbout && !st; k++) cur[k] = res[k];
    }
    L->depth--;
  }
  for (int i = 0; i < out->n && !st; i++) st = scope_bind(L, s, out->name[i], res[i], out->node[i]);
  free(cur);
  free(res);
  names_free(&in);
  return st;
}

static smelt_status load_nodes(Loader *L, Scope *s, yaml_node_t *node) {
  yaml_node_t *seq;
  RETURN_IF_ERROR(get_seq(L, node, "nodes", &seq));
  for (int i = 0; i < seq_len(seq); i++) {
    yaml_node_t *n = seq_item(L, seq, i);
    if (n->type != YAML_MAPPING_NODE)
      return errf(L, n, "a node must be a mapping like {out: y, op: add, in: [a, b]}, got %s", kind_name(n));
    RETURN_IF_ERROR(check_keys(L, n, NULL, "node"));
    yaml_node_t *vout = map_find(L, n, "out");
    if (!vout || is_null(vout)) return errf(L, n, "node needs 'out' (the name of its result)");
    NameList out;
    RETURN_IF_ERROR(get_names(L, vout, "out", &out));
    if (out.n == 0) {
      names_free(&out);
      return errf(L, vout, "node needs at least one name in 'out'");
    }
    const char *nname = ir_name(L, s, out.name[0]);
    smelt_status st;
    if (map_find(L, n, "repeat")) st = load_repeat_node(L, s, n, &out, nname);
    else if (map_find(L, n, "op")) st = load_op_node(L, s, n, &out, nname);
    else st = errf(L, n, "node '%s' needs 'op' (or 'repeat' to instantiate a block)", nname);
    names_free(&out);
    RETURN_IF_ERROR(st);
  }
  return NULL;
}

/* Blocks are checked once up front, so that a mistake in their outline is
 * found even in a block no node repeats; their params and nodes are checked
 * when instantiated. */
static smelt_status check_blocks(Loader *L, yaml_node_t *node) {
  RETURN_IF_ERROR(get_map(L, node, "blocks", &L->blocks));
  RETURN_IF_ERROR(check_keys(L, L->blocks, NULL, "blocks"));
  for (int i = 0; i < map_len(L->blocks); i++) {
    yaml_node_t *k = map_key(L, L->blocks, i), *b = map_val(L, L->blocks, i), *tmp;
    const char *bname;
    RETURN_IF_ERROR(get_name(L, k, "block name", &bname));
    char what[200];
    snprintf(what, sizeof what, "block '%s'", bname);
    if (b->type != YAML_MAPPING_NODE)
      return errf(L, b, "%s must be a mapping with inputs, params, nodes and outputs", what);
    RETURN_IF_ERROR(check_keys(L, b, block_keys, what));
    RETURN_IF_ERROR(get_map(L, map_find(L, b, "params"), "block params", &tmp));
    RETURN_IF_ERROR(get_seq(L, map_find(L, b, "nodes"), "block nodes", &tmp));
    const char *lists[2] = {"inputs", "outputs"};
    for (int l = 0; l < 2; l++) {
      yaml_node_t *v = map_find(L, b, lists[l]);
      if (!v || v->type != YAML_SEQUENCE_NODE)
        return errf(L, v ? v : b, "%s needs '%s', a list of names", what, lists[l]);
      NameList nl;
      RETURN_IF_ERROR(get_names(L, v, lists[l], &nl));
      int repeat = -1;
      smelt_status st = l == 0 ? names_first_repeat(&nl, &repeat) : NULL;
      if (!st && repeat >= 0) st = errf(L, nl.node[repeat], "%s: duplicate input '%s'", what, nl.name[repeat]);
      if (!st && l == 1 && nl.n == 0) st = errf(L, v, "%s needs at least one output", what);
      names_free(&nl);
      RETURN_IF_ERROR(st);
    }
  }
  return NULL;
}

static smelt_status load_outputs(Loader *L, const Scope *s, yaml_node_t *root) {
  yaml_node_t *v = map_find(L, root, "outputs");
  if (!v) return errf(L, root, "the model needs 'outputs', the list of values it computes");
  NameList out;
  RETURN_IF_ERROR(get_names(L, v, "outputs", &out));
  smelt_status st = out.n ? NULL : errf(L, v, "'outputs' must name at least one value");
  for (int i = 0; i < out.n && !st; i++) {
    const Binding *b = scope_find(s, out.name[i]);
    if (!b) {
      st = errf(L, out.node[i], "undefined output '%s'", out.name[i]);
      break;
    }
    /* A repeat node's `out` is an alias of its last copy's value
     * ("layer.3/y"); as a model output it takes the name the model gives
     * it, the name users bind (SPEC §2). */
    Value *ov = &L->g->val[b->value];
    if (ov->kind == VK_NODE && strcmp(ov->name, out.name[i]) != 0 && ir_find_value(L->g, out.name[i]) < 0)
      ov->name = ir_graph_strdup(L->g, out.name[i]);
    ir_add_output(L->g, b->value);
  }
  names_free(&out);
  return st;
}

/* ---- the file ---- */

static smelt_status parse_error(Loader *L, const yaml_parser_t *p) {
  if (L->too_deep) {
    SrcLoc loc = {L->file, (int)L->deep_at.line + 1, (int)L->deep_at.column + 1};
    return st_at(loc, "YAML nested more than %d levels deep", FE_MAX_YAML_DEPTH);
  }
  if (p->error == YAML_MEMORY_ERROR) return st_error(ST_NO_MEMORY, "%s: error: out of memory parsing YAML", L->file);
  SrcLoc loc = {L->file, 1, 1};
  if (p->error == YAML_READER_ERROR) {
    /* the reader reports a byte offset, not a mark: count lines ourselves */
    size_t off = p->problem_offset < L->text_size ? p->problem_offset : L->text_size;
    size_t bol = 0;
    for (size_t i = 0; i < off; i++)
      if (L->text[i] == '\n') loc.line++, bol = i + 1;
    loc.col = (int)(off - bol) + 1;
    return st_at(loc, "not a valid text file (binary data?): %s", p->problem ? p->problem : "unreadable");
  }
  loc.line = (int)p->problem_mark.line + 1;
  loc.col = (int)p->problem_mark.column + 1;
  if (p->context)
    return st_at(loc, "invalid YAML: %s (%s at %d:%d)", p->problem ? p->problem : "syntax error", p->context,
                 (int)p->context_mark.line + 1, (int)p->context_mark.column + 1);
  return st_at(loc, "invalid YAML: %s", p->problem ? p->problem : "syntax error");
}

/* How deeply the parser is nested now: the scanner's open flow collections
 * and block indentation levels, or the parser's state stack, which lags it. */
static int parser_depth(const yaml_parser_t *p) {
  int scan = p->flow_level + (int)(p->indents.top - p->indents.start);
  int parse = (int)(p->states.top - p->states.start);
  return scan > parse ? scan : parse;
}

/* libyaml's read handler: the text in chunks of FE_YAML_CHUNK bytes, and an
 * input error (which parse_yaml turns into ours) once the nesting is deeper
 * than FE_MAX_YAML_DEPTH, before the scanner's cost per token grows with it. */
static int read_chunk(void *data, unsigned char *buf, size_t size, size_t *size_read) {
  Loader *L = data;
  if (parser_depth(L->parser) > FE_MAX_YAML_DEPTH) {
    L->too_deep = true;
    L->deep_at = L->parser->mark;
    return 0;
  }
  size_t n = L->text_size - L->fed;
  if (n > size) n = size;
  if (n > FE_YAML_CHUNK) n = FE_YAML_CHUNK;
  memcpy(buf, L->text + L->fed, n);
  L->fed += n;
  *size_read = n;
  return 1;
}

static smelt_status parse_yaml(Loader *L) {
  yaml_parser_t p;
  if (!yaml_parser_initialize(&p)) return st_error(ST_NO_MEMORY, "out of memory");
  L->parser = &p;
  L->fed = 0;
  yaml_parser_set_input(&p, read_chunk, L);
  smelt_status st = NULL;
  if (!yaml_parser_load(&p, &L->doc)) {
    st = parse_error(L, &p);
  } else {
    L->have_doc = true;
    /* a second document would be silently ignored: refuse it */
    yaml_document_t extra;
    if (!yaml_parser_load(&p, &extra)) {
      st = parse_error(L, &p);
    } else {
      yaml_node_t *root = yaml_document_get_root_node(&extra);
      if (root) {
        SrcLoc loc = {L->file, (int)extra.start_mark.line + 1, (int)extra.start_mark.column + 1};
        st = st_at(loc, "the file holds more than one YAML document; a model is one");
      }
      yaml_document_delete(&extra);
    }
  }
  yaml_parser_delete(&p);
  L->parser = NULL;
  return st;
}

static const char *const top_keys[] = {"smelt", "name", "seed", "dtype", "dims", "weights", "inputs",
                                       "params", "state", "blocks", "nodes", "outputs", NULL};

static smelt_status open_weights_file(Loader *L, yaml_node_t *v, const char *wname);

/* `weights:` one file, a list of files, or a Hugging Face
 * model.safetensors.index.json (its weight_map names the shards). */
static smelt_status load_weights(Loader *L, yaml_node_t *v) {
  if (v->type == YAML_SEQUENCE_NODE) {
    if (seq_len(v) == 0) return errf(L, v, "weights: an empty list (name .safetensors files, or leave weights out)");
    if (seq_len(v) > FE_MAX_WEIGHT_FILES)
      return errf(L, v, "weights: %d files, more than the limit of %d", seq_len(v), FE_MAX_WEIGHT_FILES);
    for (int i = 0; i < seq_len(v); i++) {
      const char *w;
      RETURN_IF_ERROR(get_text(L, seq_item(L, v, i), "weights", &w));
      RETURN_IF_ERROR(open_weights_file(L, seq_item(L, v, i), w));
    }
    return NULL;
  }
  const char *wname;
  RETURN_IF_ERROR(get_text(L, v, "weights", &wname));
  size_t wl = strlen(wname);
  if (wl > 11 && strcmp(wname + wl - 11, ".index.json") == 0) {
    char **files = NULL;
    int nfiles = 0;
    char *ipath = NULL;
    if (wname[0] == '/' || !L->dir) ipath = strdup(wname);
    else if ((ipath = malloc(strlen(L->dir) + wl + 2))) sprintf(ipath, "%s/%s", L->dir, wname);
    if (!ipath) return st_error(ST_NO_MEMORY, "out of memory");
    smelt_status st = fe_safetensors_index_files(ipath, &files, &nfiles);
    free(ipath);
    if (st) {
      smelt_status located = errf(L, v, "weights index '%s': %s", wname, st_message(st));
      st_free(st);
      return located;
    }
    const char *slash = strrchr(wname, '/');
    for (int i = 0; i < nfiles && !st; i++) {
      /* shards are named relative to the index */
      char *rel = malloc(strlen(wname) + strlen(files[i]) + 2);
      if (!rel) st = st_error(ST_NO_MEMORY, "out of memory");
      else {
        sprintf(rel, "%.*s%s", slash ? (int)(slash - wname + 1) : 0, wname, files[i]);
        if (nfiles > FE_MAX_WEIGHT_FILES) st = errf(L, v, "weights index '%s': %d files, more than the limit of %d", wname, nfiles, FE_MAX_WEIGHT_FILES);
        else st = open_weights_file(L, v, ir_graph_strdup(L->g, rel));
      }
      free(rel);
    }
    for (int i = 0; i < nfiles; i++) free(files[i]);
    free(files);
    return st;
  }
  return open_weights_file(L, v, wname);
}

static smelt_status open_weights_file(Loader *L, yaml_node_t *v, const char *wname) {
  if (!*wname) return errf(L, v, "weights must name a .safetensors file");
  if (L->nweights == FE_MAX_WEIGHT_FILES)
    return errf(L, v, "weights: more than the limit of %d files", FE_MAX_WEIGHT_FILES);
  char *path = NULL;
  if (wname[0] == '/' || !L->dir) {
    path = strdup(wname);
  } else {
    path = malloc(strlen(L->dir) + strlen(wname) + 2);
    if (path) sprintf(path, "%s/%s", L->dir, wname);
  }
  if (!path) return st_error(ST_NO_MEMORY, "out of memory");
  int k = L->nweights;
  smelt_status st = fe_safetensors_open_bare(path, &L->weights[k]);
  if (!st) L->nweights++;
  if (!st && !(L->weights_path[k] = ir_graph_strdup(L->g, path))) st = st_error(ST_NO_MEMORY, "out of memory");
  free(path);
  if (st) {
    smelt_status located = errf(L, v, "weights file '%s': %s", wname, st_message(st));
    st_free(st);
    return located;
  }
  L->weights_name[k] = ir_graph_strdup(L->g, wname); /* outlives the YAML document: provenance names it */
  return NULL;
}

static smelt_status load_model(Loader *L, const char *path, const FeOptions *opts) {
  smelt_status st = fe_read_file(path, FE_MAX_MODEL_BYTES, &L->text, &L->text_size);
  if (st) {
    smelt_status io = st_error(st_code(st), "%s: error: %s", path, st_message(st));
    st_free(st);
    return io;
  }
  /* the default model name is the file's base name without extension */
  const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
  size_t blen = strcspn(base, ".");
  char defname[256];
  snprintf(defname, sizeof defname, "%.*s", (int)(blen && blen < 200 ? blen : 200), blen ? base : "model");
  L->g = ir_graph_create(defname);
  if (!L->g) return st_error(ST_NO_MEMORY, "out of memory");
  L->g->file = ir_graph_strdup(L->g, path);
  L->file = L->g->file;
  if (strrchr(path, '/')) {
    L->dir = strndup(path, (size_t)(strrchr(path, '/') - path));
    if (!L->dir) return st_error(ST_NO_MEMORY, "out of memory");
  }

  RETURN_IF_ERROR(parse_yaml(L));
  yaml_node_t *root = yaml_document_get_root_node(&L->doc);
  SrcLoc top = {L->file, 1, 1};
  if (!root) return st_at(top, "empty model file (expected a mapping starting with 'smelt: 1')");
  if (root->type != YAML_MAPPING_NODE)
    return errf(L, root, "a model must be a YAML mapping starting with 'smelt: 1', got %s", kind_name(root));
  RETURN_IF_ERROR(check_keys(L, root, top_keys, "the model"));

  yaml_node_t *v = map_find(L, root, "smelt");
  int64_t version;
  if (!v) return errf(L, root, "missing 'smelt: 1' (the model format version)");
  RETURN_IF_ERROR(get_int(L, v, "smelt (the format version)", &version));
  if (version != 1) return errf(L, v, "unknown format version %lld (this smelt reads version 1)", (long long)version);

  if ((v = map_find(L, root, "name"))) {
    const char *name;
    RETURN_IF_ERROR(get_text(L, v, "name", &name));
    L->g->name = ir_graph_strdup(L->g, name);
  }
  if ((v = map_find(L, root, "seed"))) {
    int64_t seed;
    RETURN_IF_ERROR(get_int(L, v, "seed", &seed));
    L->seed = (uint64_t)seed;
  }
  L->dtype = DT_F32;
  if ((v = map_find(L, root, "dtype"))) RETURN_IF_ERROR(get_dtype(L, v, "dtype", &L->dtype));
  if (opts && opts->dtype != DT_INVALID) {
    L->dtype = opts->dtype;
    L->dtype_from_cli = true;
  }
  RETURN_IF_ERROR(load_dims(L, map_find(L, root, "dims"), opts));
  if ((v = map_find(L, root, "weights"))) RETURN_IF_ERROR(load_weights(L, v));
  RETURN_IF_ERROR(check_blocks(L, map_find(L, root, "blocks")));

  Scope s;
  memset(&s, 0, sizeof s);
  s.prefix = "";
  s.copy = -1;
  st = load_tensor_decls(L, &s, map_find(L, root, "inputs"), false);
  if (!st) st = load_params(L, &s, map_find(L, root, "params"), "params");
  if (!st) st = load_tensor_decls(L, &s, map_find(L, root, "state"), true);
  if (!st) st = load_nodes(L, &s, map_find(L, root, "nodes"));
  if (!st) st = load_outputs(L, &s, root);
  if (!st) st = ir_check_states(L->g);
  scope_free(&s);
  return st;
}

/* What the compile cache needs before compiling: the model's text is
 * parsed (small) and only its top-level `weights` key read; the paths are
 * resolved as load_weights resolves them (an index file: the index, then
 * its shards). */
static char *resolve_beside(const char *model, const char *w) {
  const char *slash = strrchr(model, '/');
  size_t n = strlen(model) + strlen(w) + 2;
  char *full = malloc(n);
  if (!full) return NULL;
  if (w[0] == '/' || !slash) snprintf(full, n, "%s", w);
  else snprintf(full, n, "%.*s/%s", (int)(slash - model), model, w);
  return full;
}

static smelt_status push_path(char ***paths, int *n, char *p) {
  if (!p) return st_error(ST_NO_MEMORY, "out of memory");
  char **np = realloc(*paths, sizeof **paths * (size_t)(*n + 1));
  if (!np) {
    free(p);
    return st_error(ST_NO_MEMORY, "out of memory");
  }
  *paths = np;
  np[(*n)++] = p;
  return NULL;
}

smelt_status fe_yaml_weights_files(const char *path, char ***out_paths, int *out_n) {
  *out_paths = NULL;
  *out_n = 0;
  Loader L;
  memset(&L, 0, sizeof L);
  L.file = path;
  smelt_status st = fe_read_file(path, FE_MAX_MODEL_BYTES, &L.text, &L.text_size);
  if (!st) st = parse_yaml(&L);
  yaml_node_t *root = !st ? yaml_document_get_root_node(&L.doc) : NULL;
  char **paths = NULL;
  int n = 0;
  for (int i = 0; !st && root && root->type == YAML_MAPPING_NODE && i < map_len(root); i++) {
    yaml_node_t *k = map_key(&L, root, i), *v = map_val(&L, root, i);
    if (!is_scalar(k) || strcmp(sval(k), "weights") != 0) continue;
    int count = v->type == YAML_SEQUENCE_NODE ? seq_len(v) : 1;
    for (int j = 0; j < count && !st; j++) {
      yaml_node_t *item = v->type == YAML_SEQUENCE_NODE ? seq_item(&L, v, j) : v;
      if (!is_scalar(item) || !sval(item)[0]) {
        st = st_error(ST_INVALID_INPUT, "%s: 'weights' is not a file name", path);
        break;
      }
      const char *w = sval(item);
      char *full = resolve_beside(path, w);
      size_t wl = strlen(w);
      bool index = wl > 11 && strcmp(w + wl - 11, ".index.json") == 0;
      char **shards = NULL;
      int ns = 0;
      if (index && full) {
        smelt_status ist = fe_safetensors_index_files(full, &shards, &ns);
        st_free(ist); /* the compile reports it, located */
      }
      st = push_path(&paths, &n, full);
      for (int s = 0; s < ns; s++) {
        if (!st) {
          char *rel = malloc(strlen(w) + strlen(shards[s]) + 2);
          const char *slash = strrchr(w, '/');
          if (rel) sprintf(rel, "%.*s%s", slash ? (int)(slash - w + 1) : 0, w, shards[s]);
          st = push_path(&paths, &n, rel ? resolve_beside(path, rel) : NULL);
          free(rel);
        }
        free(shards[s]);
      }
      free(shards);
    }
  }
  if (L.have_doc) yaml_document_delete(&L.doc);
  free(L.text);
  if (st) {
    for (int i = 0; i < n; i++) free(paths[i]);
    free(paths);
    return st;
  }
  *out_paths = paths;
  *out_n = n;
  return NULL;
}

smelt_status fe_load_yaml(const char *path, const FeOptions *opts, Graph **out_graph) {
  *out_graph = NULL;
  Loader L;
  memset(&L, 0, sizeof L);
  L.file = path;
  smelt_status st = load_model(&L, path, opts);
  /* out of memory while building the graph: whatever error the scratch
   * storage led to later, that is the error (ir.h, "Out of memory") */
  if (L.g && L.g->oom) {
    st_free(st);
    st = ir_graph_status(L.g);
  }
  if (L.have_doc) yaml_document_delete(&L.doc);
  for (int i = 0; i < L.nweights; i++) fe_safetensors_close(L.weights[i]);
  free(L.dims);
  name_index_free(&L.dim_index);
  free(L.dir);
  free(L.text);
  if (st) {
    ir_graph_destroy(L.g);
    return st;
  }
  *out_graph = L.g;
  return NULL;
}
