/* libFuzzer target: the safetensors reader (frontend/safetensors.c) and
 * the reader of a Hugging Face model.safetensors.index.json, which names
 * the shards.  Beyond the rules of fuzz.h: every tensor of an accepted
 * file can be read for its nbytes (ASan watches), lies inside the file, and
 * is found under its own name. */
#include "frontend/fe_internal.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_put("w.safetensors", data, size);
  SafeTensors *s = NULL;
  smelt_status st = fe_safetensors_open(path, &s);
  if (st) {
    if (s) fuzz_fail("a failed open gives no file", st_message(st));
    fuzz_check_error(st, path);
  } else {
    unsigned sum = 0;
    for (int i = 0; i < fe_safetensors_count(s); i++) {
      const SafeTensor *t = fe_safetensors_at(s, i);
      const unsigned char *p = t->data;
      for (size_t k = 0; k < t->nbytes; k++) sum += p[k];
      if (t->offset > size || t->nbytes > size - t->offset)
        fuzz_fail("a tensor lies inside the file", t->name);
      if (fe_safetensors_find(s, t->name) != t) fuzz_fail("a tensor is found under its name", t->name);
    }
    (void)sum;
    fe_safetensors_close(s);
  }
  char **files = NULL;
  int n = 0;
  st = fe_safetensors_index_files(path, &files, &n);
  if (st) {
    fuzz_check_error(st, NULL); /* bare messages: the caller places them */
  } else {
    for (int i = 0; i < n; i++) free(files[i]);
    free(files);
  }
  return 0;
}
