/* Graph serialisation: a compact little-endian binary form of everything a
 * Graph holds, and a decoder that trusts none of it.
 *
 * Layout (integers little-endian, no padding; `str` is a u32 byte count and
 * that many bytes without a NUL, the count 0xffffffff standing for NULL):
 *
 *   header   u8[4] "SGRF", u32 version, str name, str file (nullable),
 *            i64 arena_bytes, i64 unplanned_bytes,
 *            u32 nval, u32 nnode, u32 ngroups, u32 ninputs, u32 noutputs,
 *            u32 nstates
 *   value    str name, u8 kind (W_VK_*), str dtype name ("" = not inferred),
 *            u8 rank, i64 dim[rank], per axis u8 dyn (0 fixed, else
 *            1 + range index) and when dyn i32 a, i32 b, i32 node, i32 out_index, str init
 *            (nullable), i32 line, i32 col, i64 mem_offset,
 *            u8 store (W_CS_*: 0 none, 1 constants blob, 2 external
 *            tensor), and unless 0: u64 index (blob offset, a multiple
 *            of 64, or external tensor number), u64 nbytes
 *   node     str op name, u8 dead, i32 group, i32 line, i32 col,
 *            u32 nin, i32 in[nin], u32 nout, i32 out[nout], u32 nattr, then
 *            per attribute: str name, u8 type (W_AT_*), payload:
 *              int, bool  i64          float  f64 (IEEE-754 bits)
 *              ints       u32 n, i64[n] dtype, enum  str
 *   group    u8 kind (W_GK_*), i32 anchor, i64 footprint, i64 budget,
 *            str kernel (nullable), u32 nnodes, i32 nodes[nnodes]
 *   then     i32 inputs[ninputs], i32 outputs[noutputs], i32 states[nstates]
 *            (input values that are state tensors, ir.h), u8 nranges and
 *            per range str name, i64 min, i64 max (ranged dims, ir.h);
 *            nothing after.
 *
 * Operators and dtypes are written by name and the small enums (value kind,
 * attribute type, group kind) through the W_* codes below, which are part of
 * the format: the in-memory enums may be reordered without breaking bundles.
 * Value and node ids are written as they are, so a decoded graph has the
 * same ids as the one encoded (the memory plan and kernel tables refer to
 * them).  All counts come first in the header so that every id can be
 * range-checked as it is read, and so that an absurd count is caught before
 * anything is allocated for it: each record has a minimum encoded size, and
 * the counts must fit in the bytes that are left.
 *
 * Constant bytes are not in the graph section: the sink (serialize.h) puts
 * them in the bundle's constants blob, deduplicated across
 * specialisations, or names an external tensor, and the value records
 * where.  A constant that nothing uses (no live node, graph output or
 * kernel argument reads it: what a pass left behind) is written as a dead
 * value, so its bytes never reach the bundle.  The decoder points constants
 * at the blob it is given, after checking the range, size and alignment.
 *
 * Decoding reads each field through a bounds-checked cursor whose first error
 * sticks; records are checked as they are read (ranks, dims, sizes, dtypes,
 * op names, attribute schema), then the graph as a whole (every id in range,
 * values and nodes pointing at each other, group membership, memory offsets
 * inside the arena), and finally ir_verify() re-runs shape inference.  Only
 * then is the graph handed out. */
#include "bytes.h"
#include "serialize.h"

#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Constant data is used byte for byte between the graph and the bundle,
 * and the bundle is little-endian: a big-endian host would need swapping
 * that nothing in smelt does. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "smelt's bundle format assumes a little-endian host"
#endif

static const unsigned char MAGIC[4] = {'S', 'G', 'R', 'F'};
#define NULL_STR 0xffffffffu

/* Wire codes: fixed by the format, independent of the enums in ir.h. */
enum { W_VK_INPUT = 0, W_VK_CONST = 1, W_VK_NODE = 2, W_VK_DEAD = 3 };
enum { W_AT_INT = 0, W_AT_FLOAT = 1, W_AT_BOOL = 2, W_AT_INTS = 3, W_AT_DTYPE = 4, W_AT_ENUM = 5 };
enum { W_GK_ELEMWISE = 0, W_GK_REDUCTION = 1, W_GK_CONTRACTION = 2, W_GK_OPAQUE = 3 };
enum { W_CS_NONE = 0, W_CS_BLOB = 1, W_CS_EXTERN = 2 };

/* Minimum encoded sizes of the records, for bounding counts. */
#define MIN_VALUE_BYTES 39 /* name 4, kind 1, dtype 4, rank 1, node 4, out_index 4, init 4, loc 8, mem 8, store 1 */
#define MIN_NODE_BYTES 29  /* op 4, dead 1, group 4, loc 8, nin 4, nout 4, nattr 4 */
#define MIN_GROUP_BYTES 29 /* kind 1, anchor 4, footprint 8, budget 8, kernel 4, nnodes 4 */

/* Largest tensor the format accepts: its byte count fits in int64 for any
 * dtype, so ir_type_numel and ir_type_bytes cannot overflow on it. */
#define MAX_NUMEL (INT64_MAX / 8)

/* Checks rank and dims and that every prefix product of the dims stays below
 * MAX_NUMEL (ir_type_numel multiplies left to right, so [2^40, 2^40, 0] would
 * overflow before reaching the 0).  Returns a description of the fault, or
 * NULL when the type is sound. */
static const char *type_fault(const TensorType *t) {
  if (t->rank < 0 || t->rank > IR_MAX_RANK) return "rank out of range";
  int64_t n = 1;
  for (int i = 0; i < t->rank; i++) {
    if (t->dim[i] < 0) return "negative dimension";
    if (t->dim[i] > 0 && n > MAX_NUMEL / t->dim[i]) return "tensor too large";
    n *= t->dim[i];
  }
  return NULL;
}

/* ---------------------------------------------------------------- encoder */

static void put_str(ByteBuf *b, const char *s) {
  if (!s) {
    bb_u32(b, NULL_STR);
    return;
  }
  size_t n = strlen(s);
  if (n >= NULL_STR) { /* unrepresentable; no real name is 4 GB long */
    b->oom = true;
    return;
  }
  bb_u32(b, (uint32_t)n);
  bb_put(b, s, n);
}

static unsigned wire_value_kind(ValueKind k) {
  switch (k) {
  case VK_INPUT: return W_VK_INPUT;
  case VK_CONST: return W_VK_CONST;
  case VK_NODE: return W_VK_NODE;
  case VK_DEAD: return W_VK_DEAD;
  }
  return 0xff;
}

static unsigned wire_attr_type(AttrType t) {
  switch (t) {
  case AT_INT: return W_AT_INT;
  case AT_FLOAT: return W_AT_FLOAT;
  case AT_BOOL: return W_AT_BOOL;
  case AT_INTS: return W_AT_INTS;
  case AT_DTYPE: return W_AT_DTYPE;
  case AT_ENUM: return W_AT_ENUM;
  }
  return 0xff;
}

static unsigned wire_group_kind(GroupKind k) {
  switch (k) {
  case GK_ELEMWISE: return W_GK_ELEMWISE;
  case GK_REDUCTION: return W_GK_REDUCTION;
  case GK_CONTRACTION: return W_GK_CONTRACTION;
  case GK_OPAQUE: return W_GK_OPAQUE;
  }
  return 0xff;
}

static const char *dtype_wire_name(DType dt) { return dt == DT_INVALID ? "" : dt_name(dt); }

static smelt_status put_value(ByteBuf *b, const Graph *g, int id, bool used, const IrConstSink *sink) {
  const Value *v = &g->val[id];
  /* the rank bounds the dims read below; a constant's whole type bounds the
   * data stored.  Other faults are left for the decoder to report. */
  bool has_data = v->kind == VK_CONST && v->data;
  const char *fault = v->type.rank < 0 || v->type.rank > IR_MAX_RANK ? "rank out of range"
                      : has_data                                     ? type_fault(&v->type)
                                                                     : NULL;
  if (fault) return st_error(ST_INTERNAL, "serialize: value %d ('%s'): %s", id, v->name, fault);
  /* an unused constant goes as a dead value: it keeps its id, not its bytes */
  ValueKind kind = v->kind == VK_CONST && !used ? VK_DEAD : v->kind;
  has_data = has_data && kind == VK_CONST;
  IrConstRef ref = {0};
  if (has_data) {
    if (!sink) return st_error(ST_INTERNAL, "serialize: constant '%s' but no place for its bytes", v->name);
    RETURN_IF_ERROR(sink->put(sink->ctx, g, id, &ref));
    if (ref.where != IR_CONST_BLOB && ref.where != IR_CONST_EXTERN)
      return st_error(ST_INTERNAL, "serialize: constant '%s' stored nowhere", v->name);
  }
  put_str(b, v->name);
  bb_u8(b, wire_value_kind(kind));
  put_str(b, dtype_wire_name(v->type.dt));
  bb_u8(b, (unsigned)v->type.rank);
  for (int i = 0; i < v->type.rank; i++) bb_i64(b, v->type.dim[i]);
  for (int i = 0; i < v->type.rank; i++) {
    bb_u8(b, (unsigned)(uint8_t)v->type.dyn[i]);
    if (!v->type.dyn[i]) continue;
    bb_i32(b, v->type.dyn_a[i]);
    bb_i32(b, v->type.dyn_b[i]);
  }
  bb_i32(b, v->node);
  bb_i32(b, v->out_index);
  put_str(b, v->init);
  bb_i32(b, v->loc.line);
  bb_i32(b, v->loc.col);
  bb_i64(b, v->mem_offset);
  /* only a constant's data means anything; a dead value may still point at
   * the data of a constant that failed to fold, and that is dropped */
  if (!has_data) {
    bb_u8(b, W_CS_NONE);
    return NULL;
  }
  bb_u8(b, ref.where == IR_CONST_BLOB ? W_CS_BLOB : W_CS_EXTERN);
  bb_u64(b, ref.index);
  bb_u64(b, ir_type_bytes(&v->type));
  return NULL;
}

static smelt_status put_node(ByteBuf *b, const Node *n, int id) {
  if (n->op < 0 || n->op >= OP_COUNT) return st_error(ST_INTERNAL, "serialize: node %d has op number %d", id, (int)n->op);
  put_str(b, ir_op_name(n->op));
  bb_u8(b, n->dead);
  bb_i32(b, n->group);
  bb_i32(b, n->loc.line);
  bb_i32(b, n->loc.col);
  bb_u32(b, (uint32_t)n->nin);
  for (int i = 0; i < n->nin; i++) bb_i32(b, n->in[i]);
  bb_u32(b, (uint32_t)n->nout);
  for (int i = 0; i < n->nout; i++) bb_i32(b, n->out[i]);
  bb_u32(b, (uint32_t)n->nattr);
  for (int i = 0; i < n->nattr; i++) {
    const Attr *a = &n->attr[i];
    put_str(b, a->name);
    bb_u8(b, wire_attr_type(a->type));
    switch (a->type) {
    case AT_INT:
    case AT_BOOL: bb_i64(b, a->i); break;
    case AT_FLOAT: bb_f64(b, a->f); break;
    case AT_INTS:
      bb_u32(b, (uint32_t)a->n);
      for (int k = 0; k < a->n; k++) bb_i64(b, a->ints[k]);
      break;
    case AT_DTYPE: put_str(b, dtype_wire_name(a->dt)); break;
    case AT_ENUM: put_str(b, a->s); break;
    }
  }
  return NULL;
}

static void put_group(ByteBuf *b, const Group *gr) {
  bb_u8(b, wire_group_kind(gr->kind));
  bb_i32(b, gr->anchor);
  bb_i64(b, gr->footprint);
  bb_i64(b, gr->budget);
  put_str(b, gr->kernel);
  bb_u32(b, (uint32_t)gr->nnodes);
  for (int i = 0; i < gr->nnodes; i++) bb_i32(b, gr->nodes[i]);
}

/* used[v]: something reads constant v (a live node, a graph output, the
 * sink's keep list).  NULL when out of memory. */
static bool *constants_used(const Graph *g, const IrConstSink *sink) {
  bool *used = calloc((size_t)(g->nval ? g->nval : 1), sizeof *used);
  if (!used) return NULL;
  for (int i = 0; i < g->nnode; i++) {
    const Node *n = &g->node[i];
    if (n->dead) continue;
    for (int j = 0; j < n->nin; j++)
      if (n->in[j] >= 0 && n->in[j] < g->nval) used[n->in[j]] = true;
  }
  for (int i = 0; i < g->noutputs; i++)
    if (g->outputs[i] >= 0 && g->outputs[i] < g->nval) used[g->outputs[i]] = true;
  for (int v = 0; sink && sink->keep && v < g->nval; v++) used[v] |= sink->keep[v];
  return used;
}

smelt_status ir_graph_serialize(const Graph *g, const IrConstSink *sink, void **out_buf, size_t *out_len) {
  *out_buf = NULL;
  *out_len = 0;
  ByteBuf b = {0};
  bool *used = constants_used(g, sink);
  if (!used) return st_error(ST_NO_MEMORY, "serialize: out of memory");
  smelt_status st = NULL;
  bb_put(&b, MAGIC, 4);
  bb_u32(&b, IR_SERIAL_VERSION);
  put_str(&b, g->name);
  put_str(&b, g->file);
  bb_i64(&b, g->arena_bytes);
  bb_i64(&b, g->unplanned_bytes);
  bb_u32(&b, (uint32_t)g->nval);
  bb_u32(&b, (uint32_t)g->nnode);
  bb_u32(&b, (uint32_t)g->ngroups);
  bb_u32(&b, (uint32_t)g->ninputs);
  bb_u32(&b, (uint32_t)g->noutputs);
  bb_u32(&b, (uint32_t)g->nstates);
  for (int v = 0; v < g->nval && !st; v++) st = put_value(&b, g, v, used[v], sink);
  free(used);
  for (int i = 0; i < g->nnode && !st; i++) st = put_node(&b, &g->node[i], i);
  for (int k = 0; k < g->ngroups && !st; k++) put_group(&b, &g->groups[k]);
  for (int i = 0; i < g->ninputs && !st; i++) bb_i32(&b, g->inputs[i]);
  for (int i = 0; i < g->noutputs && !st; i++) bb_i32(&b, g->outputs[i]);
  for (int i = 0; i < g->nstates && !st; i++) bb_i32(&b, g->states[i]);
  bb_u8(&b, (unsigned)g->nranges);
  for (int i = 0; i < g->nranges && !st; i++) {
    put_str(&b, g->ranges[i].name);
    bb_i64(&b, g->ranges[i].min);
    bb_i64(&b, g->ranges[i].max);
  }
  if (!st && b.oom) st = st_error(ST_NO_MEMORY, "serialize: out of memory");
  if (st) {
    free(b.p);
    return st;
  }
  *out_buf = b.p;
  *out_len = b.len;
  return NULL;
}

/* ---------------------------------------------------------------- decoder */

typedef struct {
  const unsigned char *p;
  size_t len, pos;
  char ctx[96]; /* what is being read, for messages: "value 12", "node 3 (add)" */
  smelt_status st; /* the first error; later reads return zeros */
  const IrConstSpace *cs; /* where constants point */
} Reader;

static void fail(Reader *r, const char *fmt, ...) SMELT_PRINTF(2, 3);
static void fail(Reader *r, const char *fmt, ...) {
  if (r->st) return;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  r->st = st_error(ST_INVALID_INPUT, "graph section: %s: %s", r->ctx, msg);
}

static void fail_oom(Reader *r) {
  if (!r->st) r->st = st_error(ST_NO_MEMORY, "out of memory reading the graph");
}

static void set_ctx(Reader *r, const char *fmt, ...) SMELT_PRINTF(2, 3);
static void set_ctx(Reader *r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->ctx, sizeof r->ctx, fmt, ap);
  va_end(ap);
}

/* Returns a pointer to the next n bytes and moves past them, or NULL (with
 * the error recorded) when fewer are left. */
static const unsigned char *take(Reader *r, size_t n, const char *what) {
  if (r->st) return NULL;
  if (n > r->len - r->pos) {
    fail(r, "truncated: %s needs %zu bytes at offset %zu, only %zu left", what, n, r->pos, r->len - r->pos);
    return NULL;
  }
  const unsigned char *p = r->p + r->pos;
  r->pos += n;
  return p;
}

static size_t left(const Reader *r) { return r->len - r->pos; }

static unsigned rd_u8(Reader *r, const char *what) {
  const unsigned char *p = take(r, 1, what);
  return p ? p[0] : 0;
}

static uint32_t rd_u32(Reader *r, const char *what) {
  const unsigned char *p = take(r, 4, what);
  uint32_t v = 0;
  for (int i = 0; p && i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}

static uint64_t rd_u64(Reader *r, const char *what) {
  const unsigned char *p = take(r, 8, what);
  uint64_t v = 0;
  for (int i = 0; p && i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static int32_t rd_i32(Reader *r, const char *what) {
  uint32_t u = rd_u32(r, what);
  int32_t v;
  memcpy(&v, &u, 4); /* two's complement reinterpretation without UB */
  return v;
}

static int64_t rd_i64(Reader *r, const char *what) {
  uint64_t u = rd_u64(r, what);
  int64_t v;
  memcpy(&v, &u, 8);
  return v;
}

static double rd_f64(Reader *r, const char *what) {
  uint64_t u = rd_u64(r, what);
  double v;
  memcpy(&v, &u, 8);
  return v;
}

/* A string as a view into the buffer; *is_null tells NULL from "". */
static const char *rd_view(Reader *r, size_t *out_len, bool *is_null, const char *what) {
  *out_len = 0;
  *is_null = false;
  uint32_t n = rd_u32(r, what);
  if (r->st) return NULL;
  if (n == NULL_STR) {
    *is_null = true;
    return NULL;
  }
  const char *s = (const char *)take(r, n, what);
  if (!s) return NULL;
  if (memchr(s, 0, n)) {
    fail(r, "%s contains a NUL byte", what);
    return NULL;
  }
  *out_len = n;
  return s;
}

/* A string copied into the graph's arena; NULL only when nullable. */
static const char *rd_str(Reader *r, Graph *g, bool nullable, const char *what) {
  size_t n;
  bool is_null;
  const char *s = rd_view(r, &n, &is_null, what);
  if (r->st) return NULL;
  if (is_null) {
    if (!nullable) fail(r, "%s is missing", what);
    return NULL;
  }
  char *d = ir_graph_alloc(g, n + 1);
  if (!d) {
    fail_oom(r);
    return NULL;
  }
  memcpy(d, s, n);
  return d;
}

/* A short string (op, dtype or attribute name) into buf; one that does not
 * fit is an error, as no known name is that long. */
static void rd_short(Reader *r, char *buf, size_t cap, const char *what) {
  size_t n;
  bool is_null;
  const char *s = rd_view(r, &n, &is_null, what);
  buf[0] = 0;
  if (r->st) return;
  if (is_null) {
    fail(r, "%s is missing", what);
  } else if (n >= cap) {
    fail(r, "%s is %zu bytes long, longer than any known one", what, n);
  } else {
    memcpy(buf, s, n);
    buf[n] = 0;
  }
}

/* A dtype by name; "" stands for not-yet-inferred (DT_INVALID) and is
 * accepted only where allow_invalid. */
static DType rd_dtype(Reader *r, bool allow_invalid, const char *what) {
  char name[16];
  rd_short(r, name, sizeof name, what);
  if (r->st) return DT_INVALID;
  if (!name[0] && allow_invalid) return DT_INVALID;
  DType dt = dt_from_name(name);
  if (dt == DT_INVALID) fail(r, "unknown %s '%s'", what, name);
  return dt;
}

/* A u32 count of records, each at least min_bytes long, that must fit in the
 * bytes left (so allocations stay proportional to the input) and in an int. */
static int rd_count(Reader *r, size_t min_bytes, const char *what) {
  uint32_t n = rd_u32(r, what);
  if (r->st) return 0;
  if (n > INT_MAX || (uint64_t)n * min_bytes > left(r)) {
    fail(r, "%s %u is impossible: only %zu bytes are left", what, n, left(r));
    return 0;
  }
  return (int)n;
}

static void rd_magic_version(Reader *r) {
  set_ctx(r, "header");
  const unsigned char *m = take(r, 4, "magic");
  if (m && memcmp(m, MAGIC, 4) != 0) {
    fail(r, "bad magic (not an encoded graph)");
    return;
  }
  uint32_t version = rd_u32(r, "version");
  if (!r->st && version != IR_SERIAL_VERSION)
    fail(r, "unsupported encoding version %u (this smelt reads version %d)", version, IR_SERIAL_VERSION);
}

static void rd_value(Reader *r, Graph *g, int id) {
  Value *v = &g->val[id];
  set_ctx(r, "value %d", id);
  v->name = rd_str(r, g, false, "name");
  if (v->name) set_ctx(r, "value %d ('%.60s')", id, v->name);
  unsigned kind = rd_u8(r, "kind");
  switch (kind) {
  case W_VK_INPUT: v->kind = VK_INPUT; break;
  case W_VK_CONST: v->kind = VK_CONST; break;
  case W_VK_NODE: v->kind = VK_NODE; break;
  case W_VK_DEAD: v->kind = VK_DEAD; break;
  default: fail(r, "unknown value kind %u", kind); return;
  }
  bool needs_type = v->kind == VK_INPUT || v->kind == VK_CONST;
  v->type.dt = rd_dtype(r, !needs_type, "dtype");
  unsigned rank = rd_u8(r, "rank");
  if (r->st) return;
  if (rank > IR_MAX_RANK) {
    fail(r, "rank %u exceeds the maximum %d", rank, IR_MAX_RANK);
    return;
  }
  v->type.rank = (int)rank;
  for (unsigned i = 0; i < rank; i++) v->type.dim[i] = rd_i64(r, "dimension");
  for (unsigned i = 0; i < rank && !r->st; i++) {
    unsigned dyn = rd_u8(r, "ranged axis");
    if (!dyn) continue;
    if (dyn > IR_MAX_RANGES) {
      fail(r, "axis %u refers to range %u of at most %d", i, dyn, IR_MAX_RANGES);
      return;
    }
    v->type.dyn[i] = (int8_t)dyn;
    v->type.dyn_a[i] = rd_i32(r, "ranged axis scale");
    v->type.dyn_b[i] = rd_i32(r, "ranged axis offset");
    if (!r->st && v->type.dyn_a[i] <= 0) fail(r, "axis %u: ranged extent %d * d %+d", i, v->type.dyn_a[i], v->type.dyn_b[i]);
  }
  if (r->st) return;
  const char *fault = type_fault(&v->type);
  if (fault) {
    char buf[256];
    fail(r, "%s in its type %s", fault, ir_type_str(&v->type, buf, sizeof buf));
    return;
  }
  v->node = rd_i32(r, "producer node");
  v->out_index = rd_i32(r, "result index");
  v->init = rd_str(r, g, true, "init");
  v->loc.file = g->file;
  v->loc.line = rd_i32(r, "line");
  v->loc.col = rd_i32(r, "column");
  v->mem_offset = rd_i64(r, "memory offset");
  unsigned store = rd_u8(r, "constant store");
  if (r->st) return;
  if (v->mem_offset < -1) fail(r, "memory offset %lld is negative", (long long)v->mem_offset);
  if (store > W_CS_EXTERN) fail(r, "constant store is %u, not 0, 1 or 2", store);
  if (store && v->kind != VK_CONST) fail(r, "carries data but is not a constant");
  if (!store && v->kind == VK_CONST) fail(r, "is a constant without data");
  if (r->st || !store) return;
  uint64_t index = rd_u64(r, "constant offset");
  uint64_t nbytes = rd_u64(r, "data size");
  size_t want = ir_type_bytes(&v->type); /* bounded by type_fault */
  if (!r->st && nbytes != want) {
    char buf[256];
    fail(r, "holds %llu bytes of data but its type %s needs %zu", (unsigned long long)nbytes,
         ir_type_str(&v->type, buf, sizeof buf), want);
    return;
  }
  if (r->st) return;
  /* a constant of no bytes still has an address (the verifier wants one) */
  static _Alignas(64) unsigned char empty[64];
  if (store == W_CS_BLOB) {
    if (index % 64) fail(r, "constant offset %llu is not a multiple of 64", (unsigned long long)index);
    else if (index > r->cs->blob_len || want > r->cs->blob_len - index)
      fail(r, "constant bytes %llu..%llu lie outside the constants section (%zu bytes)", (unsigned long long)index,
           (unsigned long long)index + want, r->cs->blob_len);
    else v->data = want ? (unsigned char *)r->cs->blob + index : empty; /* read-only: see serialize.h */
  } else {
    if (index >= (uint64_t)r->cs->next)
      fail(r, "external tensor %llu of %d", (unsigned long long)index, r->cs->next);
    else if (r->cs->ext_len[index] != want)
      fail(r, "external tensor %llu has %zu bytes, the constant needs %zu", (unsigned long long)index,
           r->cs->ext_len[index], want);
    else v->data = want ? r->cs->ext[index] : empty;
  }
}

/* Finds the schema entry of attribute `name` of op; false when absent. */
static bool find_attr_spec(Op op, const char *name, AttrSpec *out) {
  int na = ir_op_attr_count(op);
  for (int i = 0; i < na; i++) {
    ir_op_attr_spec(op, i, out);
    if (strcmp(out->name, name) == 0) return true;
  }
  return false;
}

static bool enum_word_ok(const char *words, const char *w) {
  size_t n = strlen(w);
  for (const char *p = words; *p;) {
    const char *bar = strchr(p, '|');
    size_t len = bar ? (size_t)(bar - p) : strlen(p);
    if (len == n && memcmp(p, w, n) == 0) return true;
    if (!bar) break;
    p = bar + 1;
  }
  return false;
}

static const char *attr_type_name(AttrType t) {
  static const char *names[] = {"int", "float", "bool", "ints", "dtype", "enum"};
  return t >= AT_INT && t <= AT_ENUM ? names[t] : "?";
}

/* Reads one attribute of node `id` and sets it through the ir.h API.  The
 * schema is checked here for every node, dead ones included, because the
 * verifier only looks at live nodes. */
static void rd_attr(Reader *r, Graph *g, int id) {
  Op op = g->node[id].op;
  char name[40];
  rd_short(r, name, sizeof name, "attribute name");
  unsigned wt = rd_u8(r, "attribute type");
  if (r->st) return;
  AttrSpec spec;
  if (!find_attr_spec(op, name, &spec)) {
    fail(r, "attribute '%s' is not in the schema of %s", name, ir_op_name(op));
    return;
  }
  if (ir_attr(&g->node[id], name)) {
    fail(r, "attribute '%s' appears twice", name);
    return;
  }
  AttrType t;
  switch (wt) {
  case W_AT_INT: t = AT_INT; break;
  case W_AT_FLOAT: t = AT_FLOAT; break;
  case W_AT_BOOL: t = AT_BOOL; break;
  case W_AT_INTS: t = AT_INTS; break;
  case W_AT_DTYPE: t = AT_DTYPE; break;
  case W_AT_ENUM: t = AT_ENUM; break;
  default: fail(r, "attribute '%s' has unknown type code %u", name, wt); return;
  }
  if (t != spec.type) {
    fail(r, "attribute '%s' has type %s, the schema says %s", name, attr_type_name(t), attr_type_name(spec.type));
    return;
  }
  switch (t) {
  case AT_INT: {
    int64_t v = rd_i64(r, "attribute value");
    if (!r->st) ir_set_attr_int(g, id, name, v);
    break;
  }
  case AT_BOOL: {
    int64_t v = rd_i64(r, "attribute value");
    if (!r->st && v != 0 && v != 1) fail(r, "bool attribute '%s' is %lld", name, (long long)v);
    if (!r->st) ir_set_attr_bool(g, id, name, v == 1);
    break;
  }
  case AT_FLOAT: {
    double v = rd_f64(r, "attribute value");
    if (!r->st) ir_set_attr_float(g, id, name, v);
    break;
  }
  case AT_INTS: {
    int n = rd_count(r, 8, "attribute length");
    const unsigned char *p = take(r, (size_t)n * 8, "attribute values");
    if (!p) break;
    int64_t *v = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    if (!v) {
      r->st = st_error(ST_NO_MEMORY, "out of memory");
      break;
    }
    for (int i = 0; i < n; i++) {
      uint64_t u = 0;
      for (int k = 0; k < 8; k++) u |= (uint64_t)p[8 * i + k] << (8 * k);
      memcpy(&v[i], &u, 8);
    }
    ir_set_attr_ints(g, id, name, v, n);
    free(v);
    break;
  }
  case AT_DTYPE: {
    DType dt = rd_dtype(r, false, "attribute dtype");
    if (!r->st) ir_set_attr_dtype(g, id, name, dt);
    break;
  }
  case AT_ENUM: {
    char word[64];
    rd_short(r, word, sizeof word, "attribute word");
    if (!r->st && !enum_word_ok(spec.enum_words, word))
      fail(r, "attribute '%s' is '%s', not one of %s", name, word, spec.enum_words);
    if (!r->st) ir_set_attr_enum(g, id, name, word);
    break;
  }
  }
}

/* Reads n value ids into an arena array, each checked against nval. */
static int *rd_ids(Reader *r, Graph *g, int n, const char *what) {
  int *ids = ir_graph_alloc(g, sizeof(int) * (size_t)(n ? n : 1));
  if (!ids) fail_oom(r);
  for (int i = 0; i < n && !r->st; i++) {
    ids[i] = rd_i32(r, what);
    if (!r->st && (ids[i] < 0 || ids[i] >= g->nval)) fail(r, "%s %d is value %d of %d", what, i, ids[i], g->nval);
  }
  return ids;
}

static void rd_node(Reader *r, Graph *g, int id) {
  Node *n = &g->node[id];
  n->group = -1;
  set_ctx(r, "node %d", id);
  char opname[40];
  rd_short(r, opname, sizeof opname, "op name");
  if (r->st) return;
  Op op = ir_op_from_name(opname);
  if (op == OP_COUNT) {
    fail(r, "unknown op '%s'", opname);
    return;
  }
  n->op = op;
  set_ctx(r, "node %d (%s)", id, opname);
  unsigned dead = rd_u8(r, "dead flag");
  if (!r->st && dead > 1) fail(r, "dead flag is %u, not 0 or 1", dead);
  n->dead = dead == 1;
  n->group = rd_i32(r, "group");
  n->loc.file = g->file;
  n->loc.line = rd_i32(r, "line");
  n->loc.col = rd_i32(r, "column");
  const OpInfo *oi = ir_op_info(op);
  n->nin = rd_count(r, 4, "operand count");
  if (!r->st && (n->nin < oi->min_in || n->nin > oi->max_in))
    fail(r, "has %d operands, %s takes %d to %d", n->nin, opname, oi->min_in, oi->max_in);
  if (r->st) return;
  n->in = rd_ids(r, g, n->nin, "operand");
  n->nout = rd_count(r, 4, "result count");
  if (!r->st && (oi->nout >= 0 ? n->nout != oi->nout : n->nout < 1))
    fail(r, "has %d results, %s makes %d", n->nout, opname, oi->nout);
  if (r->st) return;
  n->out = rd_ids(r, g, n->nout, "result");
  int nattr = rd_count(r, 9, "attribute count"); /* name 4, type 1, payload >= 4 */
  for (int i = 0; i < nattr && !r->st; i++) rd_attr(r, g, id);
}

static void rd_group(Reader *r, Graph *g) {
  unsigned kind = rd_u8(r, "kind");
  GroupKind gk = GK_ELEMWISE;
  switch (kind) {
  case W_GK_ELEMWISE: gk = GK_ELEMWISE; break;
  case W_GK_REDUCTION: gk = GK_REDUCTION; break;
  case W_GK_CONTRACTION: gk = GK_CONTRACTION; break;
  case W_GK_OPAQUE: gk = GK_OPAQUE; break;
  default: fail(r, "unknown group kind %u", kind); return;
  }
  int k = ir_add_group(g, gk); /* reallocates g->groups: index after the call */
  if (k < 0) {
    fail_oom(r);
    return;
  }
  Group *gr = &g->groups[k];
  gr->anchor = rd_i32(r, "anchor");
  gr->footprint = rd_i64(r, "footprint");
  gr->budget = rd_i64(r, "budget");
  gr->kernel = rd_str(r, g, true, "kernel name");
  gr->nnodes = rd_count(r, 4, "member count");
  gr->nodes = ir_graph_alloc(g, sizeof(int) * (size_t)(gr->nnodes ? gr->nnodes : 1));
  if (!gr->nodes) {
    gr->nnodes = 0;
    fail_oom(r);
  }
  for (int i = 0; i < gr->nnodes && !r->st; i++) {
    gr->nodes[i] = rd_i32(r, "member");
    if (!r->st && (gr->nodes[i] < 0 || gr->nodes[i] >= g->nnode))
      fail(r, "member %d is node %d of %d", i, gr->nodes[i], g->nnode);
  }
  if (!r->st && (gr->anchor < -1 || gr->anchor >= g->nnode)) fail(r, "anchor is node %d of %d", gr->anchor, g->nnode);
  if (!r->st && (gr->footprint < 0 || gr->budget < 0)) fail(r, "negative footprint or budget");
}

/* Cross-checks that need the whole graph: values and nodes point at each
 * other, group membership agrees with node.group, inputs are inputs, and
 * planned tensors lie inside the arena. */
static void check_links(Reader *r, Graph *g) {
  for (int v = 0; v < g->nval && !r->st; v++) {
    const Value *x = &g->val[v];
    set_ctx(r, "value %d ('%.60s')", v, x->name);
    if (x->out_index < 0) {
      fail(r, "result index %d is negative", x->out_index);
      break;
    }
    if (x->kind != VK_NODE) {
      if (x->node != -1) fail(r, "is not a node result but refers to node %d", x->node);
      continue;
    }
    if (x->node < 0 || x->node >= g->nnode) {
      fail(r, "refers to node %d of %d", x->node, g->nnode);
    } else {
      const Node *n = &g->node[x->node];
      if (x->out_index >= n->nout || n->out[x->out_index] != v)
        fail(r, "claims to be result %d of node %d, which does not list it", x->out_index, x->node);
    }
    if (!r->st && x->mem_offset >= 0) {
      int64_t bytes = (int64_t)ir_type_bytes(&x->type);
      if (x->mem_offset > g->arena_bytes || bytes > g->arena_bytes - x->mem_offset)
        fail(r, "lies at arena offset %lld (%lld bytes), past the arena's %lld bytes", (long long)x->mem_offset,
             (long long)bytes, (long long)g->arena_bytes);
    }
  }
  for (int i = 0; i < g->nnode && !r->st; i++) {
    const Node *n = &g->node[i];
    set_ctx(r, "node %d (%s)", i, ir_op_name(n->op));
    for (int j = 0; j < n->nout && !r->st; j++) {
      const Value *x = &g->val[n->out[j]];
      if (x->kind != VK_NODE || x->node != i || x->out_index != j)
        fail(r, "result %d is value %d, which is not result %d of this node", j, n->out[j], j);
    }
    if (!r->st && (n->group < -1 || n->group >= g->ngroups))
      fail(r, "is in group %d of %d", n->group, g->ngroups);
  }
  /* every member of group k has node.group == k, and is listed once */
  int *count = calloc((size_t)g->nnode + 1, sizeof(int));
  if (!count) {
    if (!r->st) r->st = st_error(ST_NO_MEMORY, "out of memory");
    return;
  }
  for (int k = 0; k < g->ngroups && !r->st; k++) {
    const Group *gr = &g->groups[k];
    set_ctx(r, "group %d", k);
    for (int j = 0; j < gr->nnodes && !r->st; j++) {
      int m = gr->nodes[j];
      if (g->node[m].group != k) fail(r, "lists node %d, which is in group %d", m, g->node[m].group);
      else if (++count[m] > 1) fail(r, "lists node %d twice", m);
    }
  }
  for (int i = 0; i < g->nnode && !r->st; i++) {
    set_ctx(r, "node %d (%s)", i, ir_op_name(g->node[i].op));
    if (g->node[i].group >= 0 && count[i] == 0) fail(r, "is in group %d, which does not list it", g->node[i].group);
  }
  free(count);
  set_ctx(r, "inputs");
  for (int i = 0; i < g->ninputs && !r->st; i++) {
    int v = g->inputs[i];
    if (g->val[v].kind != VK_INPUT || g->val[v].state) fail(r, "input %d is value %d, which is not an input", i, v);
    for (int j = 0; j < i && !r->st; j++)
      if (g->inputs[j] == v) fail(r, "value %d is listed twice", v);
  }
}

smelt_status ir_graph_deserialize(const void *buf, size_t len, const IrConstSpace *cs, Graph **out_graph) {
  *out_graph = NULL;
  static const IrConstSpace none = {0};
  Reader r = {.p = buf, .len = len, .cs = cs ? cs : &none};
  rd_magic_version(&r);
  if (r.st) return r.st;
  Graph *g = ir_graph_create(NULL);
  if (!g) return st_error(ST_NO_MEMORY, "out of memory");
  g->name = rd_str(&r, g, false, "graph name");
  g->file = rd_str(&r, g, true, "file name");
  g->arena_bytes = rd_i64(&r, "arena size");
  g->unplanned_bytes = rd_i64(&r, "unplanned size");
  if (!r.st && (g->arena_bytes < 0 || g->unplanned_bytes < 0)) fail(&r, "negative memory plan size");
  /* the counts, bounded together by the bytes they need at least */
  uint32_t nval = rd_u32(&r, "value count"), nnode = rd_u32(&r, "node count");
  uint32_t ngroups = rd_u32(&r, "group count"), nin = rd_u32(&r, "input count"), nout = rd_u32(&r, "output count");
  uint32_t nstate = rd_u32(&r, "state count");
  uint64_t need = (uint64_t)nval * MIN_VALUE_BYTES + (uint64_t)nnode * MIN_NODE_BYTES +
                  (uint64_t)ngroups * MIN_GROUP_BYTES + ((uint64_t)nin + nout + nstate) * 4;
  if (!r.st && need > left(&r))
    fail(&r, "%u values, %u nodes, %u groups, %u inputs and %u outputs need at least %llu bytes, only %zu are left",
         nval, nnode, ngroups, nin, nout, (unsigned long long)need, left(&r));
  if (!r.st) {
    /* need <= left(&r) bounds every count far below INT_MAX; one slot
     * more than the count, the spare that ir/graph.c keeps */
    free(g->val);
    free(g->node);
    g->nval = (int)nval, g->cap_val = (int)nval + 1;
    g->nnode = (int)nnode, g->cap_node = (int)nnode + 1;
    g->val = calloc((size_t)nval + 1, sizeof(Value));
    g->node = calloc((size_t)nnode + 1, sizeof(Node));
    g->inputs = calloc(nin ? nin : 1, sizeof(int));
    g->cap_inputs = (int)(nin ? nin : 1);
    if (!g->val || !g->node || !g->inputs) r.st = st_error(ST_NO_MEMORY, "out of memory");
  }
  for (int v = 0; v < g->nval && !r.st; v++) {
    g->val[v].node = -1;
    g->val[v].mem_offset = -1;
    rd_value(&r, g, v);
  }
  for (int i = 0; i < g->nnode && !r.st; i++) rd_node(&r, g, i);
  for (uint32_t k = 0; k < ngroups && !r.st; k++) {
    set_ctx(&r, "group %u", k);
    rd_group(&r, g);
  }
  set_ctx(&r, "inputs");
  for (uint32_t i = 0; i < nin && !r.st; i++) {
    int v = rd_i32(&r, "input");
    if (!r.st && (v < 0 || v >= g->nval)) fail(&r, "input %u is value %d of %d", i, v, g->nval);
    if (!r.st) g->inputs[g->ninputs++] = v;
  }
  set_ctx(&r, "outputs");
  for (uint32_t i = 0; i < nout && !r.st; i++) {
    int v = rd_i32(&r, "output");
    if (!r.st && (v < 0 || v >= g->nval)) fail(&r, "output %u is value %d of %d", i, v, g->nval);
    if (!r.st) ir_add_output(g, v);
  }
  set_ctx(&r, "states");
  if (!r.st) {
    g->states = calloc(nstate ? nstate : 1, sizeof(int));
    g->cap_states = (int)(nstate ? nstate : 1);
    if (!g->states) r.st = st_error(ST_NO_MEMORY, "out of memory");
  }
  for (uint32_t i = 0; i < nstate && !r.st; i++) {
    int v = rd_i32(&r, "state");
    if (!r.st && (v < 0 || v >= g->nval)) fail(&r, "state %u is value %d of %d", i, v, g->nval);
    if (!r.st && (g->val[v].kind != VK_INPUT || g->val[v].state)) fail(&r, "state %u is value %d, which is not a free input", i, v);
    if (!r.st) {
      g->val[v].state = true;
      g->states[g->nstates++] = v;
    }
  }
  set_ctx(&r, "ranges");
  unsigned nranges = r.st ? 0 : rd_u8(&r, "range count");
  if (!r.st && nranges > IR_MAX_RANGES) fail(&r, "%u ranged dims, at most %d", nranges, IR_MAX_RANGES);
  for (unsigned i = 0; i < nranges && !r.st; i++) {
    IrRange *rg = &g->ranges[i];
    rg->name = rd_str(&r, g, false, "range name");
    rg->min = rd_i64(&r, "range min");
    rg->max = rd_i64(&r, "range max");
    if (!r.st && (rg->min < 1 || rg->max < rg->min)) fail(&r, "range '%s' is %lld..%lld", rg->name, (long long)rg->min, (long long)rg->max);
    if (!r.st) g->nranges = (int)i + 1;
  }
  /* every ranged axis refers to a range, and holds its max's extent */
  for (int v = 0; v < g->nval && !r.st; v++) {
    const TensorType *t = &g->val[v].type;
    for (int a = 0; a < t->rank && !r.st; a++) {
      if (!t->dyn[a]) continue;
      if (t->dyn[a] > g->nranges) fail(&r, "value %d: axis %d refers to range %d of %d", v, a, t->dyn[a], g->nranges);
      else if ((int64_t)t->dyn_a[a] * g->ranges[t->dyn[a] - 1].max + t->dyn_b[a] != t->dim[a] ||
               (int64_t)t->dyn_a[a] * g->ranges[t->dyn[a] - 1].min + t->dyn_b[a] < 0)
        fail(&r, "value %d: axis %d's ranged extent does not match its size %lld", v, a, (long long)t->dim[a]);
    }
  }
  set_ctx(&r, "end");
  if (!r.st && g->oom) fail_oom(&r); /* an attribute or a name could not be stored */
  if (!r.st && left(&r)) fail(&r, "%zu unexpected bytes after the graph", left(&r));
  if (!r.st) check_links(&r, g);
  if (!r.st) {
    smelt_status vst = ir_verify(g);
    if (vst && st_code(vst) == ST_NO_MEMORY) {
      r.st = vst;
    } else if (vst) {
      r.st = st_error(ST_INVALID_INPUT, "graph section: the decoded graph is inconsistent: %s", st_message(vst));
      st_free(vst);
    }
  }
  if (r.st) {
    ir_graph_destroy(g);
    return r.st;
  }
  *out_graph = g;
  return NULL;
}
