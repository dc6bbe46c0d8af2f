/* Session state through the generated CUDA kernels in the CPU emulation
 * (tests/gpu/state_cases.h): a KV cache written in place by scatter and
 * read by attention with cache: true over a prefill and decode steps (the
 * state's buffer shared by the scatter's destination and result, as the
 * CUDA session places them), a scatter skipping indices outside its
 * state, and argmax over a 32000-wide vocabulary; against the reference
 * interpreter.  Without a host C++ compiler the emulation is skipped
 * (exit 77).
 */
#define _GNU_SOURCE /* RTLD_NODELETE in harness.h */
#include "tests/gpu/state_cases.h"
#include "tests/unit/check.h"

int main(void) {
  Exec e;
  const char *skip = NULL;
  CHECK_OK(h_exec_emulated(&e, &skip));
  if (skip) {
    printf("SKIP: emulated state ops: %s\n", skip);
    return 77;
  }
  CHECK(sc_run_all(&e) == 0);
  h_exec_close(&e);
  return check_done("test_cuda_state_ops");
}
