/* The smelt IR: a dataflow graph of tensor operations.
 *
 * Values and nodes are referred to by small integer ids (indices into the
 * graph's arrays), never by pointers, so passes may grow the graph freely.
 * A value is a graph input, a constant (params after initialisation, folded
 * results) or a result of a node.  Values keep the names they have in the
 * YAML ("layer.3/q"); the printer shows them that way.
 *
 * The graph owns everything it refers to: names, attributes, node operand
 * arrays and constant data live in its arena and go away with
 * ir_graph_destroy().  Allocation failure inside the IR is treated as fatal
 * (it aborts with a message), like an assert: the graphs smelt handles are
 * small next to the tensors, and threading out-of-memory through every
 * builder call would hide the logic of every pass.
 */
#ifndef SMELT_IR_H
#define SMELT_IR_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "arena.h"
#include "dtype.h"
#include "status.h"

#define IR_MAX_RANK 8

/* Ranged dims (SPEC §2, `seq: {max: 2048}`): a value whose extent along an
 * axis follows a dim chosen at run time.  dyn[a] is 0 for a fixed axis,
 * else 1 + the index of the range in Graph.ranges; the axis then holds
 * dyn_a[a] * d + dyn_b[a] elements for the range's run-time value d, and
 * dim[a] is that extent at the range's max.  Memory is laid out at the max
 * (the strides of dim[]): a run with a smaller d uses the leading part of
 * each ranged axis.  Only the compiler's last step sets these
 * (compiler/ranges.c); passes and inference see exact shapes. */
#define IR_MAX_RANGES 4
typedef struct {
  DType dt;
  int rank;
  int64_t dim[IR_MAX_RANK];
  int8_t dyn[IR_MAX_RANK];
  int32_t dyn_a[IR_MAX_RANK];
  int32_t dyn_b[IR_MAX_RANK];
} TensorType;

/* A dim declared as a range: a run takes any value in [min, max]. */
typedef struct {
  const char *name;
  int64_t min, max;
} IrRange;

int64_t ir_type_numel(const TensorType *t);
/* Whether any axis of t is ranged. */
bool ir_type_dynamic(const TensorType *t);
/* The extent of axis a of t when its range's run-time value is d (dims:
 * the value of each of Graph.ranges; NULL or a fixed axis: dim[a]). */
int64_t ir_type_extent(const TensorType *t, int a, const int64_t *dims);
size_t ir_type_bytes(const TensorType *t);
/* t as *outer rows of *block bytes each: the rows are the elements of the
 * axes before `axis`, a block everything from `axis` on (a concatenation
 * along axis puts its parts' blocks side by side in each row). */
void ir_type_blocks(const TensorType *t, int axis, size_t *outer, size_t *block);
bool ir_type_equal(const TensorType *a, const TensorType *b);
/* "f32[16,256]" into buf; returns buf. */
char *ir_type_str(const TensorType *t, char *buf, size_t n);

/* ---- operators (generated from ops.def) ---- */
typedef enum {
#define OP(id, name, mn, mx, nout, fc, attrs, infer, ref) OP_##id,
#include "ops.def"
#undef OP
  OP_COUNT
} Op;

typedef enum {
  FC_ELEMWISE,
  FC_BROADCAST,
  FC_INJECTIVE,
  FC_REDUCTION,
  FC_CONTRACTION,
  FC_OPAQUE,
} FusionClass;

typedef enum { AT_INT, AT_FLOAT, AT_BOOL, AT_INTS, AT_DTYPE, AT_ENUM } AttrType;

/* One attribute of a node; which fields are meaningful depends on type. */
typedef struct {
  const char *name;
  AttrType type;
  int64_t i;           /* AT_INT, AT_BOOL (0/1) */
  double f;            /* AT_FLOAT */
  const int64_t *ints; /* AT_INTS */
  int n;               /* AT_INTS: count */
  DType dt;            /* AT_DTYPE */
  const char *s;       /* AT_ENUM: the chosen word */
} Attr;

/* One entry of an op's attribute schema, parsed from ops.def. */
typedef struct {
  char name[32];
  AttrType type;
  char enum_words[64]; /* AT_ENUM: "none|tanh" */
  char dflt[48];       /* default in YAML syntax, "" if none */
  bool required, has_default;
} AttrSpec;

typedef struct {
  const char *name;
  int min_in, max_in, nout;
  FusionClass fclass;
  const char *attrs;
} OpInfo;

const OpInfo *ir_op_info(Op op);
const char *ir_op_name(Op op);
/* Returns OP_COUNT when the name is not an operator. */
Op ir_op_from_name(const char *name);
const char *ir_fusion_class_name(FusionClass fc);
/* Number of attributes in op's schema and the i-th of them. */
int ir_op_attr_count(Op op);
void ir_op_attr_spec(Op op, int i, AttrSpec *out);

/* ---- graph ---- */
/* VK_DEAD: the result of a node that ir_graph_compact() removed; it keeps
 * its id so that ids stay stable, but nothing may refer to it. */
typedef enum { VK_INPUT, VK_CONST, VK_NODE, VK_DEAD } ValueKind;

/* Provenance of a constant whose bytes are a copy of tensors in weights
 * files (format/weights.h): the YAML frontend sets it for a param read from
 * safetensors as it is, merge-matmuls composes it when it concatenates or
 * interleaves such weights; a constant computed any other way has none.
 * It lets `--external-weights` leave the bytes out of the bundle.  The
 * compiler confirms it against the file before relying on it (a pass that
 * rewrites a constant in place without dropping it is caught there).
 * Copy k: for r < rows, c < cols, elem bytes from file offset
 * src + r*src_row + c*src_col to constant offset dst + r*dst_row + c*dst_col. */
typedef struct {
  const char *file; /* the weights file as the frontend opened it */
  const char *name; /* as the model names it ("w4.safetensors") */
  uint64_t src, dst, rows, cols, elem, src_row, src_col, dst_row, dst_col;
} IrCopy;

typedef struct {
  int ncopies;
  const IrCopy *copies; /* in the graph's arena */
} IrSource;

typedef struct {
  const char *name;
  TensorType type;
  ValueKind kind;
  int node;      /* VK_NODE: producing node id, else -1 */
  int out_index; /* VK_NODE: which result of that node */
  void *data;    /* VK_CONST: row-major data of type.dt, in the arena */
  const char *init; /* VK_CONST: how it was made ("ones", "normal(0.02)", "folded"), for printing */
  SrcLoc loc;
  int64_t mem_offset; /* plan-memory: byte offset in the activation arena; -1 = not in the arena */
  const IrSource *source; /* VK_CONST: where its bytes come from, NULL = computed (see IrSource) */
  bool state;    /* VK_INPUT: a state tensor (Graph.states), not a graph input */
} Value;

typedef struct {
  Op op;
  int nin, nout;
  int *in, *out; /* value ids */
  int nattr;
  Attr *attr;
  SrcLoc loc;
  bool dead;     /* removed; ir_graph_compact() drops it */
  int group;     /* fusion group id, -1 when not fused */
} Node;

/* A fusion group: nodes that become one kernel (formed by the fuse pass). */
typedef enum { GK_ELEMWISE, GK_REDUCTION, GK_CONTRACTION, GK_OPAQUE } GroupKind;

typedef struct {
  GroupKind kind;
  int anchor;       /* node id of the reduction/contraction/opaque op, or the last node */
  int *nodes;       /* member node ids in topological order (arena) */
  int nnodes;
  int64_t footprint; /* bytes the group keeps on chip per tile */
  int64_t budget;    /* the budget the footprint was checked against */
  const char *kernel; /* kernel name, from the YAML names of its nodes */
} Group;

const char *ir_group_kind_name(GroupKind k);

typedef struct Graph {
  Arena arena;
  const char *name;
  const char *file; /* the model file, for messages */
  Value *val;
  int nval, cap_val;
  Node *node;
  int nnode, cap_node;
  int *inputs, ninputs, cap_inputs;
  int *outputs, noutputs, cap_outputs;
  /* State tensors (SPEC §2 `state:`): VK_INPUT values with .state set that
   * belong to a session and persist across runs.  They are not graph inputs.
   * A state is read as it is, or updated in place by the one scatter node
   * that is its only user (ir_state_update); that node's result lives in
   * the state's memory. */
  int *states, nstates, cap_states;
  /* Ranged dims (TensorType.dyn indexes this); names in the arena. */
  IrRange ranges[IR_MAX_RANGES];
  int nranges;
  Group *groups; /* fusion groups (fuse pass); node.group indexes this */
  int ngroups;
  int64_t arena_bytes;   /* plan-memory: size of the activation arena; 0 = not planned */
  int64_t unplanned_bytes; /* plan-memory: sum of all intermediates without sharing */
  /* An allocation failed while the graph was built or rewritten: the
   * functions below carried on with scratch storage (ir/graph.c, "Out of
   * memory") and the graph is only fit to be destroyed. */
  bool oom;
} Graph;

/* Out of memory.  The functions that add to a graph do not fail: when
 * memory runs out they mark the graph (g->oom) and return ids and storage
 * that are safe to use, so a frontend or a pass finishes its step and then
 * returns ir_graph_status(g).  The exceptions, which the caller checks:
 * ir_add_const leaves .data NULL, ir_graph_alloc returns NULL, ir_add_group
 * returns -1, ir_use_counts and ir_graph_clone return NULL. */
/* ST_NO_MEMORY when g is marked out of memory, else NULL. */
smelt_status ir_graph_status(const Graph *g) SMELT_MUST_USE;

/* Objects returned by ir_graph_create are owned by the caller; NULL when
 * out of memory. */
Graph *ir_graph_create(const char *name);
void ir_graph_destroy(Graph *g);
/* A deep copy (constants included); NULL when out of memory. */
Graph *ir_graph_clone(const Graph *g);

int ir_add_input(Graph *g, const char *name, TensorType t, SrcLoc loc);
/* A state tensor (appended to g->states). */
int ir_add_state(Graph *g, const char *name, TensorType t, SrcLoc loc);
/* The scatter node that updates state value `state` in place, or -1 when
 * the run only reads it. */
int ir_state_update(const Graph *g, int state);
/* For a value that lives in a state's memory (a state, or the result of
 * the scatter that updates it), that state's value id; else -1. */
int ir_state_of(const Graph *g, int v);
/* data is copied into the graph; NULL leaves the constant zero-filled.
 * Out of memory: the value's .data is NULL. */
int ir_add_const(Graph *g, const char *name, TensorType t, const void *data, SrcLoc loc);
/* Adds a node with fresh output values named out_names[i] (types left
 * DT_INVALID until ir_infer_node). Returns the node id. */
int ir_add_node(Graph *g, Op op, int nin, const int *in, int nout, const char *const *out_names,
                SrcLoc loc);
void ir_add_output(Graph *g, int value);
/* Adds an empty group and returns its id; members are set by the caller
 * (nodes array allocated with ir_graph_alloc).  -1 when out of memory. */
int ir_add_group(Graph *g, GroupKind kind);
/* Memory owned by the graph (zeroed, freed with it); NULL when out of memory. */
void *ir_graph_alloc(Graph *g, size_t bytes);
/* A copy in the graph's arena; "" when out of memory (the graph is marked). */
const char *ir_graph_strdup(Graph *g, const char *s);
/* A formatted string in the graph's arena; "" when out of memory (marked). */
const char *ir_graph_printf(Graph *g, const char *fmt, ...) SMELT_PRINTF(2, 3);
/* Looks a value up by name among live values; -1 if absent. */
int ir_find_value(const Graph *g, const char *name);

void ir_set_attr_int(Graph *g, int node, const char *name, int64_t v);
void ir_set_attr_bool(Graph *g, int node, const char *name, bool v);
void ir_set_attr_float(Graph *g, int node, const char *name, double v);
void ir_set_attr_ints(Graph *g, int node, const char *name, const int64_t *v, int n);
void ir_set_attr_dtype(Graph *g, int node, const char *name, DType dt);
void ir_set_attr_enum(Graph *g, int node, const char *name, const char *word);
/* Adds every schema attribute the node lacks that has a default. */
void ir_fill_default_attrs(Graph *g, int node);
/* NULL when the node has no such attribute. */
const Attr *ir_attr(const Node *n, const char *name);
/* Accessors for attributes that the schema guarantees (asserts otherwise;
 * ir_attr_int gives the schema default of an int or bool the node lacks). */
int64_t ir_attr_int(const Node *n, const char *name);
double ir_attr_float(const Node *n, const char *name);
const char *ir_attr_enum(const Node *n, const char *name);

/* Shape and dtype inference of one node: fills its output value types.
 * Errors point at the node's source location. */
smelt_status ir_infer_node(Graph *g, int node) SMELT_MUST_USE;

/* Rewires every use of value `from` (node operands and graph outputs) to `to`. */
void ir_replace_all_uses(Graph *g, int from, int to);
/* use_count[v] = number of node operands plus graph outputs that name v,
 * plus one for the scatter result that updates a state (the next run reads it).
 * The array has g->nval entries and is owned by the caller (free());
 * NULL when out of memory. */
int *ir_use_counts(const Graph *g);
/* Sorts live nodes topologically (stable), drops dead ones; value ids stay,
 * node ids change (group member lists are renumbered with them). */
smelt_status ir_graph_compact(Graph *g) SMELT_MUST_USE;
/* The rules of state tensors: a state updated by a scatter has no other
 * user, and neither a state nor its update is a graph output.  Errors are
 * located at the node or the state (ir_verify checks them too). */
smelt_status ir_check_states(const Graph *g) SMELT_MUST_USE;
/* Checks structural invariants and that every type agrees with inference. */
smelt_status ir_verify(const Graph *g) SMELT_MUST_USE;

/* The one textual form of the IR. */
void ir_print(FILE *f, const Graph *g);
/* The graph as Graphviz DOT (ir/dot.c): fusion groups as clusters with
 * their footprint and budget, edges as tensors with type and bytes. */
void ir_print_dot(FILE *f, const Graph *g);
/* The same text as a malloc'd string owned by the caller. */
char *ir_print_str(const Graph *g);
/* A short name for a node in messages: its first output's name. */
const char *ir_node_name(const Graph *g, const Node *n);
/* Canonical negative-axis handling: returns axis in [0, rank) or -1. */
int ir_norm_axis(int64_t axis, int rank);

/* Python slice semantics (slice.indices) for one axis of `size`: the first
 * index, the end, and the number of elements selected. */
void ir_slice_bounds(int64_t size, int64_t start, int64_t end, int64_t step, int64_t *out_start,
                     int64_t *out_end, int64_t *out_len);

/* Structural helpers */
static inline Node *ir_node_of(Graph *g, int v) {
  return g->val[v].kind == VK_NODE ? &g->node[g->val[v].node] : NULL;
}
static inline bool ir_is_const(const Graph *g, int v) { return g->val[v].kind == VK_CONST; }
/* all_reduce and all_gather: run by the runtime across the ranks of a
 * tensor-parallel bundle, never by generated code. */
static inline bool ir_op_is_collective(Op op) { return op == OP_ALL_REDUCE || op == OP_ALL_GATHER; }

#endif
