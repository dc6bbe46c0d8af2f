/* libFuzzer target: the YAML model frontend (frontend/yaml.c), both entry
 * points: fe_load_yaml, and fe_yaml_weights_files, which the compile cache
 * calls on the same text before the model is loaded. */
#include "frontend/frontend.h"
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The weights file beside every input, which seeds name in `weights:`
 * (tests/fuzz/weights.safetensors, made by make_seeds.py). */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  FILE *f = fopen(FUZZ_WEIGHTS, "rb");
  static unsigned char buf[1 << 16];
  size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
  if (!f || n == 0 || n == sizeof buf) {
    fprintf(stderr, "fuzz_yaml: cannot read %s\n", FUZZ_WEIGHTS);
    abort();
  }
  fclose(f);
  fuzz_put("weights.safetensors", buf, n);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_put("model.yaml", data, size);
  Graph *g = NULL;
  smelt_status st = fe_load_yaml(path, NULL, &g);
  if (st) {
    if (g) fuzz_fail("a failed load gives no graph", st_message(st));
    fuzz_check_error(st, path);
  } else {
    fuzz_check_graph(g);
    ir_graph_destroy(g);
  }
  char **paths = NULL;
  int n = 0;
  st = fe_yaml_weights_files(path, &paths, &n);
  if (st) {
    fuzz_check_error(st, path);
  } else {
    for (int i = 0; i < n; i++) free(paths[i]);
    free(paths);
  }
  return 0;
}
