/* The quantised decode matmuls (codegen/cuda/qgemv.c, qmma.c) on the GPU:
 * the cases of tests/gpu/quant_cases.h (unit/test_cuda_qgemv.c runs them
 * emulated), compiled by NVRTC for the device's arch and compared with the
 * reference interpreter element by element within the harness's tolerance
 * by dtype, guard bytes intact:
 *   - every case with its heuristic's kernel (qmma for f16 x where it
 *     applies, qgemv otherwise), buffers aligned and 8 bytes off;
 *   - every other tuning candidate of both families forced on four cases;
 *   - gated pairs, norm prologues, and qgemv's half mode on every f16
 *     case it takes and on x in [-600, 600) (check_half).
 * Skipped (exit 77) without a GPU.
 */
#define _GNU_SOURCE /* RTLD_NODELETE in harness.h */
#include "tests/gpu/quant_cases.h"

int main(void) {
  Exec e;
  int rc = h_cuda_test_start(&e, "test_cuda_quant");
  if (rc >= 0) return rc;
  const char *arch = rt_cuda_device_info(e.dev)->arch;
  Graph *g = cases_graph(NULL, 0);
  HStats stats = {0};
  for (size_t off = 0; off <= 8; off += 8) {
    Graph *c = ir_graph_clone(g);
    CgCudaOptions opt = {.max_units = 4, .arch = arch};
    char what[64];
    snprintf(what, sizeof what, "quantised cases, offset %zu", off);
    CHECK(h_check_graph(&e, c, NULL, &opt, off, false, what, &stats) == 0);
    ir_graph_destroy(c);
  }
  char toks[2][16][CG_VARIANT_LEN];
  int ntok[2];
  family_tokens(g, arch, toks, ntok);
  CHECK(ntok[0] >= 4 && ntok[1] >= 4);
  check_all_forced(&e, arch, toks, ntok, &stats);
  check_pairs(&e, arch, &stats);
  check_pairs_split(&e, arch, &stats);
  check_norms(&e, arch, &stats);
  check_half(&e, arch, &stats);
  h_exec_close(&e);
  ir_graph_destroy(g);
  printf("quantised matmuls on the GPU: %d values (%d elements) compared with the interpreter, %d failures, %d guard "
         "failures, worst %.2f of tolerance\n",
         stats.values, stats.elements, stats.failures, stats.guard_failures, stats.worst);
  return check_done("test_cuda_quant");
}
