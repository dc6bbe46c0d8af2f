/* The ONNX importer: a ModelProto file into a smelt graph.
 *
 * The file is decoded whole by protobuf-c, from code that protoc-c generates
 * at build time from third_party/onnx/onnx.proto (cmake/onnx.cmake); no
 * part of the wire format is decoded by hand.  The importer then makes one
 * pass over the model:
 *
 *   1. opset_import: the default domain ("" or "ai.onnx") must be at opset
 *      13 to 23; of the others, nodes may use only com.microsoft (its
 *      MatMulNBits);
 *   2. initializers become constants (raw_data, the typed repeated fields,
 *      or external data read from a side file through mmap);
 *   3. graph inputs that are not initializers become inputs; a symbolic
 *      size (dim_param) becomes a dim of that name whose value is 1 unless
 *      --dim sets it (sizes with neither value nor name get a made-up
 *      name, "INPUT_dimA");
 *   4. nodes, in file order (ONNX requires topological order), each turned
 *      into smelt ops by its converter (onnx_ops.c).  Because every size is
 *      known at this point, the shape arithmetic exporters emit (Shape ->
 *      Gather -> Concat -> Reshape, masks from ConstantOfShape/Range/Where)
 *      sees only constants: on_done() evaluates a node whose operands are
 *      all constant with the reference kernels, so such chains arrive in the
 *      IR as folded constants and attribute values;
 *   5. graph outputs; an output that is another tensor under a different
 *      name (Identity of an input) gets a copy carrying the output's name,
 *      since output names are what users bind.
 *
 * IR values keep their ONNX names.  Everything read is untrusted: sizes and
 * counts are checked before use, and every failure is a status naming the
 * file and, inside the graph, the node (index, name, op_type, domain,
 * opset).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "frontend.h"

#ifndef SMELT_HAVE_ONNX

bool fe_onnx_available(void) { return false; }

smelt_status fe_load_onnx_info(const char *path, const FeOptions *opts, Graph **out_graph, FeOnnxInfo *out_info) {
  (void)opts;
  (void)out_info;
  *out_graph = NULL;
  return st_error(ST_UNSUPPORTED,
                  "%s: error: built without ONNX support (install libprotobuf-c-dev protobuf-c-compiler)", path);
}

smelt_status fe_load_onnx(const char *path, const FeOptions *opts, Graph **out_graph) {
  return fe_load_onnx_info(path, opts, out_graph, NULL);
}

#else

#include "onnx_internal.h"

#define ONNX_MAX_FILE ((size_t)2 << 30) /* protobuf's own limit; bigger models keep weights outside */
#define ONNX_MIN_OPSET 13
#define ONNX_MAX_OPSET 23

bool fe_onnx_available(void) { return true; }

/* ---- the name table: open addressing, FNV-1a ---- */

static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static OnnxSlot *table_slot(OnnxImporter *im, const char *key) {
  size_t mask = im->cap - 1, i = (size_t)hash_str(key) & mask;
  while (im->slot[i].key && strcmp(im->slot[i].key, key) != 0) i = (i + 1) & mask;
  return &im->slot[i];
}

static int table_get(OnnxImporter *im, const char *key) {
  if (!im->cap) return -1;
  OnnxSlot *s = table_slot(im, key);
  return s->key ? s->value : -1;
}

static void table_put(OnnxImporter *im, const char *key, int value) {
  if (2 * (im->count + 1) > im->cap) {
    size_t old = im->cap;
    OnnxSlot *os = im->slot;
    im->cap = old ? 2 * old : 1024;
    im->slot = calloc(im->cap, sizeof *im->slot);
    if (!im->slot) {
      fputs("smelt: out of memory\n", stderr); /* like the IR's allocations: fatal */
      abort();
    }
    for (size_t i = 0; i < old; i++)
      if (os[i].key) *table_slot(im, os[i].key) = os[i];
    free(os);
  }
  OnnxSlot *s = table_slot(im, key);
  if (!s->key) {
    s->key = ir_graph_strdup(im->g, key);
    im->count++;
  }
  s->value = value;
}

/* ---- errors ---- */

static const char *node_label(OnnxImporter *im, char *buf, size_t cap) {
  const Onnx__NodeProto *n = im->node;
  const char *dom = n->domain && *n->domain ? n->domain : "ai.onnx";
  bool ms = !strcmp(dom, ONNX_MS_DOMAIN);
  int64_t opset = ms ? im->ms_opset : !strcmp(dom, "ai.onnx") ? im->opset : -1;
  char op[32] = "";
  if (opset >= 0) snprintf(op, sizeof op, ", opset %lld", (long long)opset);
  if (n->name && *n->name)
    snprintf(buf, cap, "node %d '%.100s' (%.60s, domain %.60s%s)", im->node_index, n->name,
             n->op_type ? n->op_type : "?", dom, op);
  else
    snprintf(buf, cap, "node %d (%.60s, domain %.60s%s)", im->node_index, n->op_type ? n->op_type : "?", dom, op);
  return buf;
}

static smelt_status node_errv(OnnxImporter *im, StatusCode code, const char *fmt, va_list ap) {
  char msg[2048], label[320];
  vsnprintf(msg, sizeof msg, fmt, ap);
  if (!im->node) return st_error(code, "%s: error: %s", im->file, msg);
  return st_error(code, "%s: error: %s: %s", im->file, node_label(im, label, sizeof label), msg);
}

smelt_status on_err(OnnxImporter *im, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  smelt_status st = node_errv(im, ST_INVALID_INPUT, fmt, ap);
  va_end(ap);
  return st;
}

smelt_status on_unsupported(OnnxImporter *im, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  smelt_status st = node_errv(im, ST_UNSUPPORTED, fmt, ap);
  va_end(ap);
  return st;
}

/* Puts an error from the IR (shape inference, a reference kernel) under the
 * node's label: those messages name IR values, not the ONNX node. */
static smelt_status wrap_ir_error(OnnxImporter *im, smelt_status st) {
  if (!st || !im->node) return st;
  char label[320];
  smelt_status w = st_error(st_code(st), "%s: error: %s: %s", im->file, node_label(im, label, sizeof label),
                            st_message(st));
  st_free(st);
  return w;
}

/* ---- dtypes ---- */

static const struct {
  int code;
  const char *name;
  DType dt;
} onnx_types[] = {
    {1, "FLOAT", DT_F32},     {2, "UINT8", DT_U8},        {3, "INT8", DT_I8},
    {4, "UINT16", DT_INVALID}, {5, "INT16", DT_INVALID},   {6, "INT32", DT_I32},
    {7, "INT64", DT_I64},     {8, "STRING", DT_INVALID},   {9, "BOOL", DT_BOOL},
    {10, "FLOAT16", DT_F16},  {11, "DOUBLE", DT_F64},      {12, "UINT32", DT_INVALID},
    {13, "UINT64", DT_INVALID}, {14, "COMPLEX64", DT_INVALID}, {15, "COMPLEX128", DT_INVALID},
    {16, "BFLOAT16", DT_BF16}, {17, "FLOAT8E4M3FN", DT_F8E4M3}, {18, "FLOAT8E4M3FNUZ", DT_INVALID},
    {19, "FLOAT8E5M2", DT_F8E5M2}, {20, "FLOAT8E5M2FNUZ", DT_INVALID}, {21, "UINT4", DT_U4},
    {22, "INT4", DT_I4}, {23, "FLOAT4E2M1", DT_INVALID},
};

const char *onnx_dtype_name(int64_t code) {
  for (size_t i = 0; i < sizeof onnx_types / sizeof onnx_types[0]; i++)
    if (onnx_types[i].code == code) return onnx_types[i].name;
  return "an unknown type";
}

DType onnx_dtype(const OnnxImporter *im, int64_t code) {
  for (size_t i = 0; i < sizeof onnx_types / sizeof onnx_types[0]; i++)
    if (onnx_types[i].code == code) return onnx_types[i].dt == DT_F32 ? im->fdtype : onnx_types[i].dt;
  return DT_INVALID;
}

static const char *supported_dtypes = "FLOAT, FLOAT16, BFLOAT16, DOUBLE, INT64, INT32, INT8, UINT8, BOOL; "
                                      "INT4, UINT4, FLOAT8E4M3FN, FLOAT8E5M2 as raw_data initializers that "
                                      "DequantizeLinear reads";

/* ---- the current node ---- */

int on_nin(const OnnxImporter *im) { return (int)im->node->n_input; }
int on_nout(const OnnxImporter *im) { return (int)im->node->n_output; }

int on_in(OnnxImporter *im, int i) {
  if (i < 0 || (size_t)i >= im->node->n_input || !im->node->input[i][0]) return -1;
  return table_get(im, im->node->input[i]);
}

smelt_status on_in_req(OnnxImporter *im, int i, int *out_value) {
  *out_value = on_in(im, i);
  if (*out_value < 0) return on_err(im, "input %d is required", i + 1);
  return NULL;
}

bool on_out_used(const OnnxImporter *im, int i) {
  return i >= 0 && (size_t)i < im->node->n_output && im->node->output[i][0];
}

const char *on_out_name(const OnnxImporter *im, int i) {
  return on_out_used(im, i) ? im->node->output[i] : on_tmp_name((OnnxImporter *)im, "out");
}

smelt_status on_bind(OnnxImporter *im, int i, int value) {
  if (!on_out_used(im, i)) return NULL;
  table_put(im, im->node->output[i], value);
  return NULL;
}

/* Outputs a model reads: set up by the node loop (each name's reader count
 * is not needed, only whether any node or graph output reads it). */
static bool name_is_read(OnnxImporter *im, const char *name);

smelt_status on_no_extra_outputs(OnnxImporter *im, int from) {
  for (int i = from; i < on_nout(im); i++)
    if (on_out_used(im, i) && name_is_read(im, im->node->output[i]))
      return on_unsupported(im, "output %d ('%s') is read, but only the first %d output%s supported", i + 1,
                            im->node->output[i], from, from == 1 ? " is" : "s are");
  return NULL;
}

/* ---- attributes ---- */

const Onnx__AttributeProto *on_attr(const OnnxImporter *im, const char *name) {
  for (size_t i = 0; i < im->node->n_attribute; i++)
    if (im->node->attribute[i]->name && strcmp(im->node->attribute[i]->name, name) == 0)
      return im->node->attribute[i];
  return NULL;
}

static smelt_status attr_kind(OnnxImporter *im, const Onnx__AttributeProto *a, int want, const char *what) {
  if (a->ref_attr_name && *a->ref_attr_name)
    return on_unsupported(im, "attribute '%s' refers to a function attribute", a->name);
  if (a->has_type && (int)a->type != want) return on_err(im, "attribute '%s' must be %s", a->name, what);
  return NULL;
}

smelt_status on_attr_int(OnnxImporter *im, const char *name, int64_t dflt, int64_t *out) {
  const Onnx__AttributeProto *a = on_attr(im, name);
  *out = dflt;
  if (!a) return NULL;
  RETURN_IF_ERROR(attr_kind(im, a, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT, "an int"));
  *out = a->i;
  return NULL;
}

smelt_status on_attr_float(OnnxImporter *im, const char *name, double dflt, double *out) {
  const Onnx__AttributeProto *a = on_attr(im, name);
  *out = dflt;
  if (!a) return NULL;
  RETURN_IF_ERROR(attr_kind(im, a, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT, "a float"));
  *out = a->f;
  return NULL;
}

smelt_status on_attr_string(OnnxImporter *im, const char *name, const char *dflt, const char **out) {
  const Onnx__AttributeProto *a = on_attr(im, name);
  *out = dflt;
  if (!a) return NULL;
  RETURN_IF_ERROR(attr_kind(im, a, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING, "a string"));
  if (!a->s.data || memchr(a->s.data, 0, a->s.len)) return on_err(im, "attribute '%s' is not a text string", name);
  /* protobuf-c keeps bytes without a terminator: copy into the graph */
  char *s = ir_graph_alloc(im->g, a->s.len + 1);
  memcpy(s, a->s.data, a->s.len);
  *out = s;
  return NULL;
}

smelt_status on_attr_ints(OnnxImporter *im, const char *name, int64_t *out, int max, int *out_n) {
  const Onnx__AttributeProto *a = on_attr(im, name);
  *out_n = -1;
  if (!a) return NULL;
  RETURN_IF_ERROR(attr_kind(im, a, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS, "a list of ints"));
  if (a->n_ints > (size_t)max) return on_err(im, "attribute '%s' has %zu values, at most %d", name, a->n_ints, max);
  for (size_t i = 0; i < a->n_ints; i++) out[i] = a->ints[i];
  *out_n = (int)a->n_ints;
  return NULL;
}

/* ---- values ---- */

const TensorType *on_type(const OnnxImporter *im, int value) { return &im->g->val[value].type; }
bool on_is_const(const OnnxImporter *im, int value) { return im->g->val[value].kind == VK_CONST; }

const char *on_tmp_name(OnnxImporter *im, const char *tag) {
  const char *base = "t";
  if (im->node && im->node->n_output && im->node->output[0][0]) base = im->node->output[0];
  for (;;) {
    char *s = arena_printf(&im->g->arena, "%s.%s%d", base, tag, im->tmp++);
    if (!s) {
      fputs("smelt: out of memory\n", stderr);
      abort();
    }
    if (table_get(im, s) < 0) return s;
  }
}

smelt_status on_const_ints(OnnxImporter *im, int value, const char *what, int64_t *out, int max, int *out_n) {
  const Value *v = &im->g->val[value];
  if (v->kind != VK_CONST)
    return on_unsupported(im, "%s ('%s') must be a constant at import time (smelt needs static shapes); it is "
                          "computed from a graph input", what, v->name);
  if (!dt_is_int(v->type.dt)) return on_err(im, "%s ('%s') must be integers, got %s", what, v->name, dt_name(v->type.dt));
  int64_t n = ir_type_numel(&v->type);
  if (n > max) return on_err(im, "%s ('%s') has %lld values, at most %d", what, v->name, (long long)n, max);
  for (int64_t i = 0; i < n; i++) {
    if (v->type.dt == DT_I64) memcpy(&out[i], (const char *)v->data + 8 * i, 8);
    else out[i] = (int64_t)dt_load(v->type.dt, v->data, (size_t)i);
  }
  *out_n = (int)n;
  return NULL;
}

smelt_status on_const_scalar(OnnxImporter *im, int value, const char *what, double *out) {
  const Value *v = &im->g->val[value];
  if (v->kind != VK_CONST)
    return on_unsupported(im, "%s ('%s') must be a constant at import time", what, v->name);
  if (ir_type_numel(&v->type) != 1) return on_err(im, "%s ('%s') must hold one value", what, v->name);
  *out = dt_load(v->type.dt, v->data, 0);
  return NULL;
}

int on_const(OnnxImporter *im, const char *name, TensorType t, const void *data) {
  if (!name) name = on_tmp_name(im, "c");
  SrcLoc loc = {im->file, 0, 0};
  int v = ir_add_const(im->g, name, t, data, loc);
  im->g->val[v].init = "onnx";
  table_put(im, name, v);
  return v;
}

int on_scalar(OnnxImporter *im, DType dt, double x) {
  TensorType t = {.dt = dt, .rank = 0};
  int v = on_const(im, NULL, t, NULL);
  dt_store(dt, im->g->val[v].data, 0, x);
  return v;
}

int on_i64s(OnnxImporter *im, const int64_t *x, int n) {
  TensorType t = {.dt = DT_I64, .rank = 1, .dim = {n}};
  return on_const(im, NULL, t, x);
}

/* ---- nodes ---- */

int on_node_multi(OnnxImporter *im, Op op, int nin, const int *in, int nout, const char *const *names) {
  SrcLoc loc = {im->file, 0, 0};
  int id = ir_add_node(im->g, op, nin, in, nout, names, loc);
  for (int i = 0; i < nout; i++) table_put(im, names[i], im->g->node[id].out[i]);
  return id;
}

int on_node(OnnxImporter *im, Op op, int nin, const int *in, const char *name) {
  if (!name) name = on_tmp_name(im, ir_op_name(op));
  return on_node_multi(im, op, nin, in, 1, &name);
}

/* Evaluates node id, all of whose operands are constant, and turns its
 * results into constants in place: the values keep their ids and names,
 * the node goes (ir_graph_compact drops it). */
static smelt_status fold_node(OnnxImporter *im, int id) {
  Graph *g = im->g;
  Node *n = &g->node[id];
  const void *ins[64];
  void *outs[64];
  if (n->nin > 64 || n->nout > 64) return NULL;
  for (int i = 0; i < n->nin; i++) ins[i] = g->val[n->in[i]].data;
  for (int i = 0; i < n->nout; i++) outs[i] = ir_graph_alloc(g, ir_type_bytes(&g->val[n->out[i]].type));
  RETURN_IF_ERROR(wrap_ir_error(im, ir_eval_node(g, n, ins, outs)));
  n = &g->node[id];
  for (int i = 0; i < n->nout; i++) {
    Value *v = &g->val[n->out[i]];
    v->kind = VK_CONST;
    v->node = -1;
    v->data = outs[i];
    v->init = "folded";
  }
  n->dead = true;
  return NULL;
}

smelt_status on_done(OnnxImporter *im, int id, int *out_value) {
  ir_fill_default_attrs(im->g, id);
  RETURN_IF_ERROR(wrap_ir_error(im, ir_infer_node(im->g, id)));
  const Node *n = &im->g->node[id];
  bool all_const = true;
  for (int i = 0; i < n->nin; i++) all_const &= im->g->val[n->in[i]].kind == VK_CONST;
  /* a dequantized weight stays quantised: the kernels read it packed */
  if (all_const && n->op != OP_DEQUANTIZE) {
    int64_t elems = 0;
    bool ints = true;
    for (int i = 0; i < n->nout; i++) {
      const TensorType *t = &im->g->val[n->out[i]].type;
      elems += ir_type_numel(t);
      ints &= !dt_is_float(t->dt);
    }
    if (elems <= (ints ? ONNX_FOLD_MAX_INT : ONNX_FOLD_MAX_FLOAT)) RETURN_IF_ERROR(fold_node(im, id));
  }
  if (out_value) *out_value = im->g->node[id].out[0];
  return NULL;
}

smelt_status on_op1(OnnxImporter *im, Op op, int x, const char *name, int *out) {
  return on_done(im, on_node(im, op, 1, &x, name), out);
}

smelt_status on_op2(OnnxImporter *im, Op op, int a, int b, const char *name, int *out) {
  return on_done(im, on_node(im, op, 2, (int[]){a, b}, name), out);
}

smelt_status on_op3(OnnxImporter *im, Op op, int a, int b, int c, const char *name, int *out) {
  return on_done(im, on_node(im, op, 3, (int[]){a, b, c}, name), out);
}

smelt_status on_reshape(OnnxImporter *im, int x, const int64_t *shape, int rank, const char *name, int *out) {
  int id = on_node(im, OP_RESHAPE, 1, &x, name);
  ir_set_attr_ints(im->g, id, "shape", shape, rank);
  return on_done(im, id, out);
}

smelt_status on_transpose(OnnxImporter *im, int x, const int64_t *perm, int rank, const char *name, int *out) {
  int id = on_node(im, OP_TRANSPOSE, 1, &x, name);
  ir_set_attr_ints(im->g, id, "perm", perm, rank);
  return on_done(im, id, out);
}

smelt_status on_slice(OnnxImporter *im, int x, int axis, int64_t start, int64_t end, int64_t step, const char *name,
                      int *out) {
  int id = on_node(im, OP_SLICE, 1, &x, name);
  ir_set_attr_int(im->g, id, "axis", axis);
  ir_set_attr_int(im->g, id, "start", start);
  ir_set_attr_int(im->g, id, "end", end);
  ir_set_attr_int(im->g, id, "step", step);
  return on_done(im, id, out);
}

smelt_status on_cast(OnnxImporter *im, int x, DType to, const char *name, int *out) {
  int id = on_node(im, OP_CAST, 1, &x, name);
  ir_set_attr_dtype(im->g, id, "to", to);
  return on_done(im, id, out);
}

smelt_status on_gather(OnnxImporter *im, int x, int idx, int axis, const char *name, int *out) {
  int id = on_node(im, OP_GATHER, 2, (int[]){x, idx}, name);
  ir_set_attr_int(im->g, id, "axis", axis);
  return on_done(im, id, out);
}

smelt_status on_concat(OnnxImporter *im, const int *xs, int n, int axis, const char *name, int *out) {
  int id = on_node(im, OP_CONCAT, n, xs, name);
  ir_set_attr_int(im->g, id, "axis", axis);
  return on_done(im, id, out);
}

/* ---- tensors ---- */

/* The element count of dims, or -1 when a size is negative or the byte
 * count (at elem_size bytes each) passes 2^50. */
static int64_t checked_numel(const int64_t *dims, size_t n, size_t elem_size) {
  int64_t numel = 1, limit = ((int64_t)1 << 50) / (int64_t)(elem_size ? elem_size : 1);
  for (size_t i = 0; i < n; i++) {
    if (dims[i] < 0) return -1;
    if (dims[i] && numel > limit / dims[i]) return -1;
    numel *= dims[i];
  }
  return numel;
}

static const char *tensor_what(const Onnx__TensorProto *t, const char *name, char *buf, size_t cap) {
  snprintf(buf, cap, "tensor '%.200s'", name ? name : t->name ? t->name : "");
  return buf;
}

/* External data: {location, offset, length} relative to the model's folder,
 * mapped read-only and copied into *out_buf (malloc'd once the file is
 * known to hold nbytes there). */
static smelt_status read_external(OnnxImporter *im, const Onnx__TensorProto *t, const char *what, size_t nbytes,
                                  void **out_buf) {
  *out_buf = NULL;
  const char *loc = NULL;
  int64_t offset = 0, length = -1;
  for (size_t i = 0; i < t->n_external_data; i++) {
    const Onnx__StringStringEntryProto *e = t->external_data[i];
    if (!e->key || !e->value) continue;
    char *end;
    if (!strcmp(e->key, "location")) loc = e->value;
    else if (!strcmp(e->key, "offset") || !strcmp(e->key, "length")) {
      errno = 0;
      long long v = strtoll(e->value, &end, 10);
      if (errno || end == e->value || *end || v < 0)
        return st_error(ST_INVALID_INPUT, "%s: error: %s: external data %s '%s' is not a size", im->file, what,
                        e->key, e->value);
      if (!strcmp(e->key, "offset")) offset = v;
      else length = v;
    }
  }
  if (!loc || !*loc) return st_error(ST_INVALID_INPUT, "%s: error: %s: external data without a location", im->file, what);
  /* the location must stay inside the model's folder, as ONNX Runtime requires */
  if (loc[0] == '/' || !strncmp(loc, "../", 3) || strstr(loc, "/../") || !strcmp(loc, ".."))
    return st_error(ST_INVALID_INPUT, "%s: error: %s: external data location '%s' leaves the model's folder", im->file,
                    what, loc);
  if (length >= 0 && (uint64_t)length != nbytes)
    return st_error(ST_INVALID_INPUT, "%s: error: %s: external data length %lld, the tensor has %zu bytes", im->file,
                    what, (long long)length, nbytes);
  char *path = malloc(strlen(im->dir ? im->dir : ".") + strlen(loc) + 2);
  if (!path) return st_error(ST_NO_MEMORY, "out of memory");
  sprintf(path, "%s/%s", im->dir ? im->dir : ".", loc);
  int fd = open(path, O_RDONLY);
  smelt_status st = NULL;
  struct stat sb;
  if (fd < 0) {
    st = st_error(ST_IO, "%s: error: %s: cannot open external data file '%s': %s", im->file, what, path, strerror(errno));
  } else if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    st = st_error(ST_IO, "%s: error: %s: external data '%s' is not a regular file", im->file, what, path);
  } else if ((uint64_t)offset > (uint64_t)sb.st_size || nbytes > (uint64_t)sb.st_size - (uint64_t)offset) {
    st = st_error(ST_INVALID_INPUT, "%s: error: %s: external data [%lld, +%zu) lies outside '%s' (%lld bytes)",
                  im->file, what, (long long)offset, nbytes, path, (long long)sb.st_size);
  } else if (!(*out_buf = malloc(nbytes ? nbytes : 1))) {
    st = st_error(ST_NO_MEMORY, "out of memory for %s (%zu bytes)", what, nbytes);
  } else if (nbytes) {
    /* map from the page that holds the offset */
    long page = sysconf(_SC_PAGESIZE);
    off_t base = (off_t)(offset / page * page);
    size_t skip = (size_t)(offset - base);
    void *m = mmap(NULL, nbytes + skip, PROT_READ, MAP_PRIVATE, fd, base);
    if (m == MAP_FAILED) {
      st = st_error(ST_IO, "%s: error: %s: cannot map '%s': %s", im->file, what, path, strerror(errno));
    } else {
      memcpy(*out_buf, (const char *)m + skip, nbytes);
      munmap(m, nbytes + skip);
    }
  }
  if (fd >= 0) close(fd);
  free(path);
  if (st) {
    free(*out_buf);
    *out_buf = NULL;
  }
  return st;
}

/* Copies n elements of the typed field `src` (element type of the field)
 * into dst of dtype dt. */
static void store_all_f(DType dt, void *dst, const float *src, size_t n) {
  for (size_t i = 0; i < n; i++) dt_store(dt, dst, i, src[i]);
}

smelt_status onnx_tensor_const(OnnxImporter *im, const Onnx__TensorProto *t, const char *name, int *out_value) {
  char what[256];
  tensor_what(t, name, what, sizeof what);
  if (!t->has_data_type)
    return st_error(ST_INVALID_INPUT, "%s: error: %s has no data type", im->file, what);
  DType src_dt = onnx_dtype(im, t->data_type), raw_dt = src_dt == im->fdtype && t->data_type == 1 ? DT_F32 : src_dt;
  if (src_dt == DT_INVALID)
    return st_error(ST_UNSUPPORTED, "%s: error: %s has type %s, which smelt does not support (supported: %s)",
                    im->file, what, onnx_dtype_name(t->data_type), supported_dtypes);
  if (t->n_dims > IR_MAX_RANK)
    return st_error(ST_UNSUPPORTED, "%s: error: %s has rank %zu, at most %d", im->file, what, t->n_dims, IR_MAX_RANK);
  if (t->segment) return st_error(ST_UNSUPPORTED, "%s: error: %s is segmented", im->file, what);
  int64_t numel = checked_numel(t->dims, t->n_dims, 8);
  if (numel < 0) return st_error(ST_INVALID_INPUT, "%s: error: %s has a negative or overflowing shape", im->file, what);
  TensorType ty = {.dt = src_dt, .rank = (int)t->n_dims};
  for (size_t i = 0; i < t->n_dims; i++) ty.dim[i] = t->dims[i];
  /* raw bytes arrive in the file's type; FLOAT becomes fdtype after */
  TensorType raw = ty;
  raw.dt = raw_dt;
  size_t nbytes = ir_type_bytes(&raw);
  size_t n = (size_t)numel;
  /* The data must be there before a buffer for it is had: a few bytes of
   * file can declare a shape of terabytes. */
  void *buf = NULL;
  int code = t->data_type;
  /* the quantised storage types (two INT4 a byte, low nibble first, as
   * smelt packs them) come as raw bytes only */
  if (dt_is_storage_only(src_dt) && !t->has_raw_data &&
      !(t->has_data_location && t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL))
    return st_error(ST_UNSUPPORTED, "%s: error: %s has type %s in int32_data; smelt reads that type as raw_data only",
                    im->file, what, onnx_dtype_name(t->data_type));
  if (t->has_data_location && t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) {
    RETURN_IF_ERROR(read_external(im, t, what, nbytes, &buf));
  } else if (t->has_raw_data) {
    if (t->raw_data.len != nbytes)
      return st_error(ST_INVALID_INPUT, "%s: error: %s: raw_data has %zu bytes, its shape needs %zu", im->file, what,
                      t->raw_data.len, nbytes);
    if (!(buf = malloc(nbytes ? nbytes : 1))) return st_error(ST_NO_MEMORY, "out of memory for %s (%zu bytes)", what, nbytes);
    if (nbytes) memcpy(buf, t->raw_data.data, nbytes); /* little endian, as smelt's hosts */
  } else {
    /* INT32, INT8, UINT8, BOOL, FLOAT16, BFLOAT16 (their bits) are in int32_data */
    size_t have = code == 1 ? t->n_float_data : code == 7 ? t->n_int64_data : code == 11 ? t->n_double_data
                                                                           : t->n_int32_data;
    if (have != n)
      return st_error(ST_INVALID_INPUT, "%s: error: %s holds %zu values, its shape needs %zu", im->file, what, have, n);
    if (!(buf = malloc(nbytes ? nbytes : 1))) return st_error(ST_NO_MEMORY, "out of memory for %s (%zu bytes)", what, nbytes);
    if (code == 1) {
      store_all_f(DT_F32, buf, t->float_data, n);
    } else if (code == 7) {
      if (n) memcpy(buf, t->int64_data, n * 8); /* an empty field is NULL, which memcpy must not get */
    } else if (code == 11) {
      if (n) memcpy(buf, t->double_data, n * 8);
    } else if (code == 10 || code == 16) {
      for (size_t i = 0; i < n; i++) ((uint16_t *)buf)[i] = (uint16_t)t->int32_data[i];
    } else {
      for (size_t i = 0; i < n; i++) dt_store(raw_dt, buf, i, (double)t->int32_data[i]);
    }
  }
  int v = on_const(im, name ? name : t->name, ty, raw_dt == src_dt ? buf : NULL);
  if (raw_dt != src_dt) /* FLOAT under --dtype f16/bf16 */
    for (size_t i = 0; i < n; i++) dt_store(src_dt, im->g->val[v].data, i, dt_load(DT_F32, buf, i));
  *out_value = v;
  free(buf);
  return NULL;
}

/* ---- reads ---- */

/* Names read by some node or graph output, to refuse unsupported extra
 * outputs only when something uses them. */
static bool name_is_read(OnnxImporter *im, const char *name) {
  /* reads are recorded under a prefix that no ONNX name can have */
  char key[512];
  snprintf(key, sizeof key, "\001read:%.500s", name);
  return table_get(im, key) >= 0;
}

static void mark_reads(OnnxImporter *im, const Onnx__GraphProto *gp) {
  char key[512];
  for (size_t i = 0; i < gp->n_node; i++)
    for (size_t j = 0; j < gp->node[i]->n_input; j++) {
      snprintf(key, sizeof key, "\001read:%.500s", gp->node[i]->input[j]);
      table_put(im, key, 1);
    }
  for (size_t i = 0; i < gp->n_output; i++)
    if (gp->output[i]->name) {
      snprintf(key, sizeof key, "\001read:%.500s", gp->output[i]->name);
      table_put(im, key, 1);
    }
}

/* ---- graph inputs and dims ---- */

static smelt_status add_dim(OnnxImporter *im, const FeOptions *opts, const char *name, int64_t *out) {
  for (int i = 0; i < im->ndims; i++)
    if (!strcmp(im->dims[i].name, name)) {
      *out = im->dims[i].value;
      return NULL;
    }
  int64_t v = 1;
  for (int i = 0; opts && i < opts->ndims; i++)
    if (!strcmp(opts->dims[i].name, name)) v = opts->dims[i].value;
  if (v <= 0) return st_error(ST_INVALID_INPUT, "%s: error: --dim %s=%lld: a dim must be positive", im->file, name, (long long)v);
  if (im->ndims == im->cap_dims) {
    im->cap_dims = im->cap_dims ? 2 * im->cap_dims : 8;
    FeDim *d = realloc(im->dims, sizeof *d * (size_t)im->cap_dims);
    if (!d) return st_error(ST_NO_MEMORY, "out of memory");
    im->dims = d;
  }
  im->dims[im->ndims].name = ir_graph_strdup(im->g, name);
  im->dims[im->ndims++].value = v;
  *out = v;
  return NULL;
}

static smelt_status load_input(OnnxImporter *im, const FeOptions *opts, const Onnx__ValueInfoProto *vi, int index) {
  const char *name = vi->name;
  if (!name || !*name) return st_error(ST_INVALID_INPUT, "%s: error: graph input %d has no name", im->file, index);
  if (!vi->type || vi->type->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !vi->type->tensor_type)
    return st_error(ST_UNSUPPORTED, "%s: error: graph input '%s' is not a tensor (sequences, maps and optionals are "
                    "not supported)", im->file, name);
  const Onnx__TypeProto__Tensor *tt = vi->type->tensor_type;
  DType dt = tt->has_elem_type ? onnx_dtype(im, tt->elem_type) : DT_INVALID;
  if (dt == DT_INVALID)
    return st_error(ST_UNSUPPORTED, "%s: error: graph input '%s' has type %s (supported: %s)", im->file, name,
                    tt->has_elem_type ? onnx_dtype_name(tt->elem_type) : "none", supported_dtypes);
  if (!tt->shape)
    return st_error(ST_UNSUPPORTED, "%s: error: graph input '%s' has no shape (smelt needs its rank)", im->file, name);
  if (tt->shape->n_dim > IR_MAX_RANK)
    return st_error(ST_UNSUPPORTED, "%s: error: graph input '%s' has rank %zu, at most %d", im->file, name,
                    tt->shape->n_dim, IR_MAX_RANK);
  TensorType t = {.dt = dt, .rank = (int)tt->shape->n_dim};
  int slot = im->g->ninputs;
  for (size_t a = 0; a < tt->shape->n_dim; a++) {
    const Onnx__TensorShapeProto__Dimension *d = tt->shape->dim[a];
    const char *dname = NULL;
    if (d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE) {
      if (d->dim_value <= 0 || d->dim_value > ((int64_t)1 << 40))
        return st_error(ST_INVALID_INPUT, "%s: error: graph input '%s': size %lld of axis %zu must be positive",
                        im->file, name, (long long)d->dim_value, a);
      t.dim[a] = d->dim_value;
    } else {
      if (d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM && d->dim_param && *d->dim_param)
        dname = d->dim_param;
      else
        dname = arena_printf(&im->g->arena, "%s_dim%zu", name, a);
      RETURN_IF_ERROR(add_dim(im, opts, dname, &t.dim[a]));
      dname = ir_graph_strdup(im->g, dname);
    }
    im->dim_of[slot * IR_MAX_RANK + (int)a] = dname;
  }
  if (checked_numel(t.dim, (size_t)t.rank, dt_size(dt)) < 0)
    return st_error(ST_INVALID_INPUT, "%s: error: graph input '%s' is too large", im->file, name);
  SrcLoc loc = {im->file, 0, 0};
  table_put(im, name, ir_add_input(im->g, name, t, loc));
  return NULL;
}

/* ---- the model ---- */

static bool is_default_domain(const char *d) { return !d || !*d || !strcmp(d, "ai.onnx"); }

static smelt_status check_opsets(OnnxImporter *im, const Onnx__ModelProto *m) {
  im->opset = im->ms_opset = -1;
  for (size_t i = 0; i < m->n_opset_import; i++) {
    const Onnx__OperatorSetIdProto *o = m->opset_import[i];
    if (is_default_domain(o->domain)) im->opset = o->has_version ? o->version : 1;
    else if (o->domain && !strcmp(o->domain, ONNX_MS_DOMAIN)) im->ms_opset = o->has_version ? o->version : 1;
  }
  if (im->opset < 0) return st_error(ST_INVALID_INPUT, "%s: error: the model imports no opset of the default domain", im->file);
  if (im->opset < ONNX_MIN_OPSET || im->opset > ONNX_MAX_OPSET)
    return st_error(ST_UNSUPPORTED,
                    "%s: error: the model uses opset %lld of the default domain; smelt imports opsets %d to %d "
                    "(convert it with onnx.version_converter)", im->file, (long long)im->opset, ONNX_MIN_OPSET,
                    ONNX_MAX_OPSET);
  return NULL;
}

static smelt_status check_attrs(OnnxImporter *im, const OnnxOpDef *def) {
  for (size_t i = 0; i < im->node->n_attribute; i++) {
    const char *a = im->node->attribute[i]->name ? im->node->attribute[i]->name : "";
    size_t n = strlen(a);
    bool known = false;
    for (const char *p = def->attrs; *p && !known;) {
      size_t w = strcspn(p, " ");
      known = w == n && !strncmp(p, a, n);
      p += w;
      while (*p == ' ') p++;
    }
    if (!known)
      return on_unsupported(im, "attribute '%s' is not supported (supported: %s)", a, *def->attrs ? def->attrs : "none");
  }
  return NULL;
}

static smelt_status convert_node(OnnxImporter *im) {
  const Onnx__NodeProto *n = im->node;
  if (!n->op_type || !*n->op_type) return on_err(im, "node has no op_type");
  if (!is_default_domain(n->domain) && strcmp(n->domain, ONNX_MS_DOMAIN) != 0)
    return on_unsupported(im, "domain '%s' is not supported: smelt imports the default domain (ai.onnx) and "
                          ONNX_MS_DOMAIN "'s MatMulNBits", n->domain);
  if (!is_default_domain(n->domain) && im->ms_opset < 0)
    return on_err(im, "the model's opset_import does not import domain " ONNX_MS_DOMAIN ", which the node uses");
  for (size_t i = 0; i < n->n_input; i++)
    if (n->input[i][0] && table_get(im, n->input[i]) < 0)
      return on_err(im, "input %zu '%s' is not defined before the node (nodes must be in topological order)", i + 1,
                    n->input[i]);
  for (size_t i = 0; i < n->n_output; i++) {
    if (n->output[i][0] && table_get(im, n->output[i]) >= 0)
      return on_err(im, "output '%s' is defined twice", n->output[i]);
    /* two outputs of this node under one name (the table sees neither yet) */
    for (size_t j = 0; j < i && n->output[i][0]; j++)
      if (strcmp(n->output[i], n->output[j]) == 0)
        return on_err(im, "output '%s' is defined twice (outputs %zu and %zu of the node)", n->output[i], j + 1, i + 1);
  }
  const char *dom = is_default_domain(n->domain) ? NULL : n->domain;
  const OnnxOpDef *def = onnx_find_op(dom, n->op_type);
  if (!def) {
    char list[1536];
    onnx_supported_ops(dom, list, sizeof list);
    if (dom) return on_unsupported(im, "operator '%s' of domain %s is not supported; smelt imports of it: %s",
                                   n->op_type, dom, list);
    return on_unsupported(im, "operator '%s' is not supported; smelt imports: %s", n->op_type, list);
  }
  RETURN_IF_ERROR(check_attrs(im, def));
  RETURN_IF_ERROR(def->fn(im));
  /* every output something reads must be bound */
  for (size_t i = 0; i < n->n_output; i++)
    if (n->output[i][0] && table_get(im, n->output[i]) < 0 && name_is_read(im, n->output[i]))
      return on_unsupported(im, "output %zu ('%s') is not supported", i + 1, n->output[i]);
  return NULL;
}

static smelt_status load_outputs(OnnxImporter *im, const Onnx__GraphProto *gp) {
  if (!gp->n_output) return st_error(ST_INVALID_INPUT, "%s: error: the graph has no outputs", im->file);
  for (size_t i = 0; i < gp->n_output; i++) {
    const char *name = gp->output[i]->name;
    int v = name && *name ? table_get(im, name) : -1;
    if (v < 0)
      return st_error(ST_INVALID_INPUT, "%s: error: graph output '%s' is not computed by any node", im->file,
                      name ? name : "");
    Value *val = &im->g->val[v];
    if (strcmp(val->name, name) != 0) {
      if (val->kind == VK_NODE) {
        val->name = ir_graph_strdup(im->g, name); /* the output's name wins over an alias */
      } else {
        /* an input or a constant under another name: copy it */
        int id = on_node(im, OP_RESHAPE, 1, &v, name);
        ir_set_attr_ints(im->g, id, "shape", val->type.dim, val->type.rank);
        /* not on_done: a constant output stays an op, computed, not a param */
        RETURN_IF_ERROR(ir_infer_node(im->g, id));
        v = im->g->node[id].out[0];
      }
    }
    for (int k = 0; k < im->g->noutputs; k++)
      if (im->g->outputs[k] == v)
        return st_error(ST_INVALID_INPUT, "%s: error: graph output '%s' is listed twice", im->file, name);
    ir_add_output(im->g, v);
  }
  return NULL;
}

static smelt_status import_model(OnnxImporter *im, const Onnx__ModelProto *m, const FeOptions *opts) {
  const Onnx__GraphProto *gp = m->graph;
  if (!gp) return st_error(ST_INVALID_INPUT, "%s: error: the model has no graph", im->file);
  RETURN_IF_ERROR(check_opsets(im, m));
  if (gp->name && *gp->name) im->g->name = ir_graph_strdup(im->g, gp->name);
  if (gp->n_sparse_initializer) return st_error(ST_UNSUPPORTED, "%s: error: sparse initializers are not supported", im->file);
  mark_reads(im, gp);
  for (size_t i = 0; i < gp->n_initializer; i++) {
    const Onnx__TensorProto *t = gp->initializer[i];
    if (!t->name || !*t->name) return st_error(ST_INVALID_INPUT, "%s: error: initializer %zu has no name", im->file, i);
    if (table_get(im, t->name) >= 0)
      return st_error(ST_INVALID_INPUT, "%s: error: initializer '%s' is defined twice", im->file, t->name);
    int v;
    RETURN_IF_ERROR(onnx_tensor_const(im, t, t->name, &v));
    im->g->val[v].init = "initializer";
  }
  im->dim_of = ir_graph_alloc(im->g, sizeof(char *) * IR_MAX_RANK * (gp->n_input + 1));
  for (size_t i = 0; i < gp->n_input; i++) {
    const Onnx__ValueInfoProto *vi = gp->input[i];
    if (vi->name && table_get(im, vi->name) >= 0) continue; /* an initializer listed as input (IR version < 4) */
    RETURN_IF_ERROR(load_input(im, opts, vi, (int)i));
  }
  for (int i = 0; opts && i < opts->ndims; i++) {
    bool found = false;
    for (int j = 0; j < im->ndims && !found; j++) found = !strcmp(im->dims[j].name, opts->dims[i].name);
    if (!found) {
      char have[256] = "";
      for (int j = 0; j < im->ndims && strlen(have) + strlen(im->dims[j].name) + 3 < sizeof have; j++) {
        strcat(have, j ? ", " : "");
        strcat(have, im->dims[j].name);
      }
      return st_error(ST_INVALID_INPUT, "%s: error: --dim %s: the model has no dim '%s' (its dims: %s)", im->file,
                      opts->dims[i].name, opts->dims[i].name, im->ndims ? have : "none");
    }
  }
  for (size_t i = 0; i < gp->n_node; i++) {
    im->node = gp->node[i];
    im->node_index = (int)i;
    smelt_status st = convert_node(im);
    if (st) return st;
  }
  im->node = NULL;
  RETURN_IF_ERROR(load_outputs(im, gp));
  return ir_graph_compact(im->g);
}

smelt_status fe_load_onnx_info(const char *path, const FeOptions *opts, Graph **out_graph, FeOnnxInfo *out_info) {
  *out_graph = NULL;
  unsigned char *buf = NULL;
  size_t size = 0;
  smelt_status st = fe_read_file(path, ONNX_MAX_FILE, &buf, &size);
  if (st) {
    smelt_status io = st_error(st_code(st), "%s: error: %s", path, st_message(st));
    st_free(st);
    return io;
  }
  Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, size, buf);
  free(buf);
  if (!m)
    return st_error(ST_INVALID_INPUT, "%s: error: not a valid ONNX file (the protobuf message is malformed or "
                    "truncated)", path);
  OnnxImporter im;
  memset(&im, 0, sizeof im);
  im.fdtype = opts && dt_is_float(opts->dtype) ? opts->dtype : DT_F32;
  if (opts && opts->dtype != DT_INVALID && !dt_is_float(opts->dtype)) {
    onnx__model_proto__free_unpacked(m, NULL);
    return st_error(ST_INVALID_INPUT, "%s: error: --dtype %s: ONNX models take a floating-point dtype", path,
                    dt_name(opts->dtype));
  }
  const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
  char defname[256];
  size_t blen = strcspn(base, ".");
  snprintf(defname, sizeof defname, "%.*s", (int)(blen && blen < 200 ? blen : 5), blen ? base : "model");
  im.g = ir_graph_create(defname);
  if (!im.g) {
    onnx__model_proto__free_unpacked(m, NULL);
    return st_error(ST_NO_MEMORY, "out of memory");
  }
  im.g->file = ir_graph_strdup(im.g, path);
  im.file = im.g->file;
  if (strrchr(path, '/')) im.dir = strndup(path, (size_t)(strrchr(path, '/') - path));
  st = import_model(&im, m, opts);
  if (!st && out_info) {
    memset(out_info, 0, sizeof *out_info);
    FeDim *d = ir_graph_alloc(im.g, sizeof *d * (size_t)(im.ndims + 1));
    if (im.ndims) memcpy(d, im.dims, sizeof *d * (size_t)im.ndims);
    out_info->dims = d;
    out_info->ndims = im.ndims;
    out_info->input_dims = im.dim_of;
    out_info->opset = im.opset;
    out_info->producer = m->producer_name ? ir_graph_strdup(im.g, m->producer_name) : "";
  }
  onnx__model_proto__free_unpacked(m, NULL);
  free(im.slot);
  free(im.dims);
  free(im.dir);
  if (st) {
    ir_graph_destroy(im.g);
    return st;
  }
  *out_graph = im.g;
  return NULL;
}

smelt_status fe_load_onnx(const char *path, const FeOptions *opts, Graph **out_graph) {
  return fe_load_onnx_info(path, opts, out_graph, NULL);
}

#endif
