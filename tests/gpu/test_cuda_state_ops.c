/* Session state through the generated CUDA kernels on the GPU
 * (tests/gpu/state_cases.h): a KV cache written in place by scatter and
 * read by attention with cache: true over a prefill and decode steps, a
 * scatter skipping indices outside its state, argmax over a 32000-wide
 * vocabulary; against the reference interpreter.
 *
 * Without a GPU it prints "SKIP: no CUDA device" and exits 77 (skipped, for ctest).
 */
#define _GNU_SOURCE /* RTLD_NODELETE in harness.h */
#include "tests/gpu/state_cases.h"
#include "tests/unit/check.h"

int main(void) {
  Exec e;
  int rc = h_cuda_test_start(&e, "test_cuda_state_ops");
  if (rc >= 0) return rc;
  CHECK(sc_run_all(&e) == 0);
  h_exec_close(&e);
  return check_done("test_cuda_state_ops");
}
