/* libFuzzer target: the .npy reader (frontend/npy.c).  Beyond the rules of
 * fuzz.h: what the reader accepts, the writer writes (one shape rule for
 * both, issue 16 #9), and reading that back gives the same type and bytes. */
#include "frontend/frontend.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_put("t.npy", data, size);
  TensorType t;
  void *buf = NULL;
  smelt_status st = fe_npy_read(path, &t, &buf);
  if (st) {
    if (buf) fuzz_fail("a failed read gives no data", st_message(st));
    fuzz_check_error(st, path);
    return 0;
  }
  char wpath[600];
  snprintf(wpath, sizeof wpath, "%s", fuzz_put("w.npy", "", 0));
  st = fe_npy_write(wpath, &t, buf);
  if (st) fuzz_fail("the writer takes what the reader accepts", st_message(st));
  TensorType t2;
  void *buf2 = NULL;
  st = fe_npy_read(wpath, &t2, &buf2);
  if (st) fuzz_fail("the reader takes what the writer wrote", st_message(st));
  if (!ir_type_equal(&t, &t2) || memcmp(buf, buf2, ir_type_bytes(&t)) != 0)
    fuzz_fail("a tensor read, written and read again is the same", "type or bytes differ");
  free(buf);
  free(buf2);
  return 0;
}
