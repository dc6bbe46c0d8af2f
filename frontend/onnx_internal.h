/* Internal to the ONNX importer (frontend/onnx*.c): the importer's state
 * and the helpers its operator converters build the graph with.
 *
 * onnx.c reads the file (protobuf-c), the initializers, the graph inputs and
 * their dims, and walks the nodes in order; for each node it finds the
 * converter in the table of onnx_ops.c, which emits smelt IR through the
 * helpers below.  Every error a converter returns through on_err() names
 * the node: "model.onnx: error: node 3 'Reshape_3' (Reshape, domain ai.onnx,
 * opset 17): ...". */
#ifndef SMELT_ONNX_INTERNAL_H
#define SMELT_ONNX_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "../ir/interp.h"
#include "fe_internal.h"
#include "onnx.pb-c.h"

/* Largest tensors the importer evaluates itself when all of a node's
 * operands are constant (shape arithmetic, masks); bigger constant
 * computations (a transposed weight) are left to the const-fold pass. */
#define ONNX_FOLD_MAX_FLOAT ((int64_t)1 << 16)
#define ONNX_FOLD_MAX_INT ((int64_t)1 << 22)

typedef struct {
  const char *key; /* NULL = empty slot */
  int value;
} OnnxSlot;

typedef struct OnnxImporter {
  Graph *g;
  const char *file; /* the model path, for messages */
  char *dir;        /* its directory, for external data */
  int64_t opset;    /* of the default domain */
  int64_t ms_opset; /* of com.microsoft; -1 when the model does not import it */
  DType fdtype;     /* what ONNX FLOAT becomes (--dtype f16 makes it f16) */
  /* ONNX tensor names (and every IR value name) -> value id */
  OnnxSlot *slot;
  size_t cap, count;
  /* the node being converted */
  const Onnx__NodeProto *node;
  int node_index;
  int tmp; /* counter for fresh names */
  /* dims from dim_param, with the values in use */
  FeDim *dims;
  int ndims, cap_dims;
  const char **dim_of; /* per graph input and axis (IR_MAX_RANK each): the dim's name or NULL */
} OnnxImporter;

/* A converter: reads im->node and binds each of its outputs. */
typedef smelt_status (*OnnxConvertFn)(OnnxImporter *im);

typedef struct {
  const char *op_type;
  OnnxConvertFn fn;
  const char *attrs; /* the attributes it understands, space-separated */
} OnnxOpDef;

/* The domain of the operators ONNX Runtime adds (MatMulNBits). */
#define ONNX_MS_DOMAIN "com.microsoft"

/* The converter tables (onnx_ops.c): the default domain's (domain NULL, ""
 * or "ai.onnx") and com.microsoft's; NULL when op_type is not supported in
 * that domain. */
const OnnxOpDef *onnx_find_op(const char *domain, const char *op_type);
/* "Abs Add ..." of the domain's supported ops (NULL: the default), for
 * messages. */
void onnx_supported_ops(const char *domain, char *buf, size_t cap);

/* ---- errors ---- */
/* An error located at the current node (ST_INVALID_INPUT). */
smelt_status on_err(OnnxImporter *im, const char *fmt, ...) SMELT_PRINTF(2, 3);
/* The same with ST_UNSUPPORTED: valid ONNX that smelt cannot import. */
smelt_status on_unsupported(OnnxImporter *im, const char *fmt, ...) SMELT_PRINTF(2, 3);

/* ---- the current node's operands and results ---- */
int on_nin(const OnnxImporter *im);
int on_nout(const OnnxImporter *im);
/* Value id of input i, or -1 when it is absent (past the end or ""). */
int on_in(OnnxImporter *im, int i);
/* Like on_in, but absent is an error naming the input. */
smelt_status on_in_req(OnnxImporter *im, int i, int *out_value) SMELT_MUST_USE;
/* Whether output i is named (not "" and present). */
bool on_out_used(const OnnxImporter *im, int i);
const char *on_out_name(const OnnxImporter *im, int i);
/* Binds ONNX output i to an existing value (an alias). */
smelt_status on_bind(OnnxImporter *im, int i, int value) SMELT_MUST_USE;
/* Refuses outputs from index `from` on that a later node or the graph reads
 * (e.g. LayerNormalization's Mean), with `what` in the message. */
smelt_status on_no_extra_outputs(OnnxImporter *im, int from) SMELT_MUST_USE;

/* ---- attributes of the current node ---- */
const Onnx__AttributeProto *on_attr(const OnnxImporter *im, const char *name);
smelt_status on_attr_int(OnnxImporter *im, const char *name, int64_t dflt, int64_t *out) SMELT_MUST_USE;
smelt_status on_attr_float(OnnxImporter *im, const char *name, double dflt, double *out) SMELT_MUST_USE;
/* *out points into the node (or is dflt); strings with NUL bytes are refused. */
smelt_status on_attr_string(OnnxImporter *im, const char *name, const char *dflt, const char **out) SMELT_MUST_USE;
/* *out_n = -1 when absent. At most max values. */
smelt_status on_attr_ints(OnnxImporter *im, const char *name, int64_t *out, int max, int *out_n) SMELT_MUST_USE;

/* ---- values ---- */
/* The type of a value: a pointer into g->val, which every value added (by
 * on_const, on_node and everything built on them) may move; copy the type
 * when it is needed after adding one. */
const TensorType *on_type(const OnnxImporter *im, int value);
bool on_is_const(const OnnxImporter *im, int value);
/* A fresh IR name derived from the current node's first output. */
const char *on_tmp_name(OnnxImporter *im, const char *tag);
/* The elements of constant integer tensor `value` (input `what` of the
 * node, for messages), at most max of them; error when it is not constant. */
smelt_status on_const_ints(OnnxImporter *im, int value, const char *what, int64_t *out, int max, int *out_n)
    SMELT_MUST_USE;
/* One constant number (a scalar or one-element tensor) as double. */
smelt_status on_const_scalar(OnnxImporter *im, int value, const char *what, double *out) SMELT_MUST_USE;
/* A constant of type t (data copied; NULL = zeros), named `name` or fresh. */
int on_const(OnnxImporter *im, const char *name, TensorType t, const void *data);
/* A rank-0 constant holding v in dtype dt. */
int on_scalar(OnnxImporter *im, DType dt, double v);
/* A 1-D i64 constant. */
int on_i64s(OnnxImporter *im, const int64_t *v, int n);

/* ---- nodes ---- */
/* Adds IR node op(in[0..nin)) with one result named `name` (NULL: fresh).
 * The caller sets attributes on the returned node id, then on_done
 * fills defaults, infers the result type and, when every operand is
 * constant and the result small, evaluates it into a constant. */
int on_node(OnnxImporter *im, Op op, int nin, const int *in, const char *name);
int on_node_multi(OnnxImporter *im, Op op, int nin, const int *in, int nout, const char *const *names);
smelt_status on_done(OnnxImporter *im, int node, int *out_value) SMELT_MUST_USE;
/* Short forms for nodes without attributes. */
smelt_status on_op1(OnnxImporter *im, Op op, int x, const char *name, int *out) SMELT_MUST_USE;
smelt_status on_op2(OnnxImporter *im, Op op, int a, int b, const char *name, int *out) SMELT_MUST_USE;
smelt_status on_op3(OnnxImporter *im, Op op, int a, int b, int c, const char *name, int *out) SMELT_MUST_USE;
/* Common data movement with static shapes. */
smelt_status on_reshape(OnnxImporter *im, int x, const int64_t *shape, int rank, const char *name, int *out)
    SMELT_MUST_USE;
smelt_status on_transpose(OnnxImporter *im, int x, const int64_t *perm, int rank, const char *name, int *out)
    SMELT_MUST_USE;
smelt_status on_slice(OnnxImporter *im, int x, int axis, int64_t start, int64_t end, int64_t step,
                      const char *name, int *out) SMELT_MUST_USE;
smelt_status on_cast(OnnxImporter *im, int x, DType to, const char *name, int *out) SMELT_MUST_USE;
smelt_status on_gather(OnnxImporter *im, int x, int idx, int axis, const char *name, int *out) SMELT_MUST_USE;
smelt_status on_concat(OnnxImporter *im, const int *xs, int n, int axis, const char *name, int *out)
    SMELT_MUST_USE;

/* ONNX TensorProto.DataType -> smelt dtype (FLOAT -> im->fdtype);
 * DT_INVALID when smelt has none. */
DType onnx_dtype(const OnnxImporter *im, int64_t onnx_type);
const char *onnx_dtype_name(int64_t onnx_type);

/* Reads a TensorProto (an initializer or a Constant's value) into a new
 * constant named `name`. */
smelt_status onnx_tensor_const(OnnxImporter *im, const Onnx__TensorProto *t, const char *name, int *out_value)
    SMELT_MUST_USE;

#endif
