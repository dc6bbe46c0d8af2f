/* libFuzzer target: the ONNX importer (frontend/onnx.c, onnx_ops.c).  The
 * protobuf wire format is decoded by protobuf-c; what is fuzzed is what the
 * importer does with the decoded model: initializers, shapes, symbolic
 * dims, every op converter and the constant folding of shape arithmetic. */
#include "frontend/frontend.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!fe_onnx_available()) {
    fprintf(stderr, "fuzz_onnx: this smelt was built without ONNX support\n");
    abort();
  }
  const char *path = fuzz_put("model.onnx", data, size);
  Graph *g = NULL;
  FeOnnxInfo info;
  smelt_status st = fe_load_onnx_info(path, NULL, &g, &info);
  if (st) {
    if (g) fuzz_fail("a failed import gives no graph", st_message(st));
    fuzz_check_error(st, path);
  } else {
    fuzz_check_graph(g);
    ir_graph_destroy(g);
  }
  return 0;
}
