/* fe_load_model: one entry point for every model format, chosen by the
 * file name's extension (".onnx", any case, is ONNX; everything else is the
 * YAML format), so that compile, run, bench and tune take either. */
#include <string.h>
#include <strings.h>

#include "frontend.h"

static bool has_suffix(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcasecmp(s + n - m, suffix) == 0;
}

smelt_status fe_load_model(const char *path, const FeOptions *opts, Graph **out_graph) {
  if (has_suffix(path, ".onnx")) return fe_load_onnx(path, opts, out_graph);
  return fe_load_yaml(path, opts, out_graph);
}
