/* The operator table (ir/ops.def) against what depends on it, so that an op
 * added to ops.def and forgotten somewhere fails here, at test time, and
 * not when a user's model first uses it:
 *   - every op has a unique name that ir_op_from_name maps back, a valid
 *     arity and fusion class, and an attribute schema that parses;
 *   - the op suites of tests/gpu/op_cases.h (which the CUDA tests run)
 *     contain every op;
 *   - every op but the collectives (which the runtime runs across ranks)
 *     goes through the CUDA backend's dispatchers: each suite,
 *     one kernel per node, generates without an error (an op that the
 *     module's anchor switch, the unary/binary expression switches or the
 *     emitter of its kind does not know fails the generation, naming it).
 * The sizes of the tables generated from ops.def are tied to OP_COUNT by
 * static asserts where they are defined (ir/op_table.c).
 */
#include <stdio.h>
#include <string.h>

#include "codegen/cuda/cg_cuda.h"
#include "codegen/lower.h"
#include "tests/gpu/op_cases.h"
#include "tests/unit/check.h"

static void test_names_and_schemas(void) {
  for (int op = 0; op < OP_COUNT; op++) {
    const OpInfo *info = ir_op_info((Op)op);
    CHECK(info && info->name && info->name[0]);
    CHECK(ir_op_from_name(info->name) == (Op)op);
    CHECK(strcmp(ir_op_name((Op)op), info->name) == 0);
    CHECK(info->min_in >= 1 && info->min_in <= info->max_in);
    CHECK(info->nout == -1 || info->nout >= 1);
    CHECK(strcmp(ir_fusion_class_name(info->fclass), "?") != 0);
    for (int j = 0; j < op; j++) CHECK(strcmp(ir_op_info((Op)j)->name, info->name) != 0);
    int na = ir_op_attr_count((Op)op);
    for (int i = 0; i < na; i++) {
      AttrSpec a;
      ir_op_attr_spec((Op)op, i, &a); /* asserts on a malformed schema */
      CHECK(a.name[0]);
    }
  }
  CHECK(ir_op_from_name("no such op") == OP_COUNT);
  CHECK(strcmp(ir_op_name(OP_COUNT), "?") == 0);
}

/* Lowers g one kernel per node and generates its CUDA module; the error's
 * message names the op a dispatcher does not know. */
static void generate_all(Graph *g, const char *what) {
  if (g->ngroups == 0) CHECK_OK(cg_single_node_groups(g));
  Kernel *k = NULL;
  int nk = 0;
  smelt_status st = cg_lower(g, &k, &nk);
  if (st) {
    fprintf(stderr, "%s: cg_lower: %s\n", what, st_message(st));
    st_free(st);
    check_failures++;
    return;
  }
  FmtCudaModule *m = NULL;
  st = cg_cuda_generate(g, k, nk, NULL, &m);
  if (st) {
    fprintf(stderr, "%s: cg_cuda_generate: %s\n", what, st_message(st));
    st_free(st);
    check_failures++;
  }
  fmt_cuda_module_free(m);
  cg_kernels_free(k, nk);
}

static void test_every_op_through_cuda(void) {
  bool seen[OP_COUNT] = {false};
  DType dts[] = {DT_F32, DT_F16, DT_BF16, DT_F64};
  for (size_t i = 0; i < sizeof dts / sizeof *dts; i++) {
    OpSuite s;
    Graph *g = oc_suite(dts[i], &s);
    if (!g) {
      fprintf(stderr, "op suite %s: %s\n", dt_name(dts[i]), s.msg);
      check_failures++;
      continue;
    }
    for (int n = 0; n < g->nnode; n++) seen[g->node[n].op] = true;
    char what[64];
    snprintf(what, sizeof what, "op suite %s", dt_name(dts[i]));
    generate_all(g, what);
    ir_graph_destroy(g);
  }
  for (int op = 0; op < OP_COUNT; op++) {
    /* collectives are run by the runtime, not by generated code; the
     * sharding tests cover them (tests/unit/test_shard.c, tests/e2e) */
    if (seen[op] || ir_op_is_collective((Op)op)) continue;
    fprintf(stderr, "op '%s' is in ops.def but in no case of tests/gpu/op_cases.h\n", ir_op_name((Op)op));
    check_failures++;
  }
}

int main(void) {
  test_names_and_schemas();
  test_every_op_through_cuda();
  return check_done("test_ops_table");
}
