/* Packed weights are stored once (issue 10 item 5): the CPU backend's GEMM
 * and conv kernels read weights packed into zero-initialised globals
 * (.bss) that each kernel's NAME__prepack fills when the bundle is opened
 * (codegen/llvm/gemm.c, runtime/loader.c), so a bundle's cpu-object holds
 * code, not a second copy of the constants section.
 *
 * For the examples whose weights dominate (tiny_llama, mlp, gpt2_block),
 * compiled for the CPU without the compile cache: the cpu-object's
 * initialised data (where weights packed at compile time sat: the object
 * was then 129%, 136% and 125% of the constants) is under 10% of the
 * constants section, read through format/bundle.h; the
 * object, loaded by runtime/elf_loader.c, exports a prepack function for
 * at least one kernel and none that is not a kernel's; and the bundle
 * opens and runs a session (the results themselves are checked against
 * the interpreter by test_capi, tests/cpu and tests/e2e, and bit for bit
 * against packing at compile time by the test_llvm_* harness).
 *
 * Models whose files are missing (tiny_llama needs generated weights) are
 * skipped with a message, not failed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/bundle.h"
#include "include/smelt.h"
#include "include/smelt_compile.h"
#include "runtime/internal.h"
#include "tests/unit/check.h"

/* Counts the kernels of b's graph that have a prepack function in the
 * cpu-object obj; *out_exports: how many functions the object exports. */
static int count_prepacks(const smelt_bundle *b, const void *obj, size_t len, int *out_exports) {
  *out_exports = -1;
  int nimp = 0;
  const RtElfImport *imp = rt_elf_default_imports(&nimp);
  RtElfImage *img = NULL;
  smelt_status st = rt_elf_load(obj, len, imp, nimp, &img);
  if (st) {
    fprintf(stderr, "loading the cpu-object: %s\n", st_message(st));
    st_free(st);
    check_failures++;
    return 0;
  }
  int n = 0;
  for (int i = 0; i < rt_bundle_num_kernels(b); i++) {
    char name[128];
    snprintf(name, sizeof name, "%s__prepack", rt_bundle_kernel(b, i)->name);
    if (rt_elf_lookup(img, name)) n++;
  }
  *out_exports = rt_elf_symbol_count(img);
  rt_elf_free(img);
  return n;
}

static void run_once(smelt_bundle *b) {
  smelt_session *s = NULL;
  CHECK_OK(smelt_session_create(b, "cpu", NULL, &s));
  if (!s) return;
  void *bufs[64] = {0};
  int nb = 0;
  for (int i = 0; i < smelt_session_num_inputs(s) + smelt_session_num_outputs(s) && nb < 64; i++) {
    bool in = i < smelt_session_num_inputs(s);
    smelt_tensor_info ti;
    if (in)
      smelt_session_input_info(s, i, &ti);
    else
      smelt_session_output_info(s, i - smelt_session_num_inputs(s), &ti);
    TensorType t = {.dt = (DType)ti.dtype, .rank = ti.rank};
    for (int d = 0; d < ti.rank; d++) t.dim[d] = ti.dims[d];
    size_t bytes = ir_type_bytes(&t);
    void *p = calloc(bytes ? bytes : 1, 1);
    bufs[nb++] = p;
    CHECK_OK(in ? smelt_session_bind_input(s, ti.name, p, bytes) : smelt_session_bind_output(s, ti.name, p, bytes));
  }
  CHECK_OK(smelt_session_run(s));
  for (int i = 0; i < nb; i++) free(bufs[i]);
  smelt_session_destroy(s);
}

/* Bytes of the ELF64 object's allocated, initialised, non-executable
 * sections (.rodata, .data, ...): where packed weights baked in at compile
 * time would be.  SIZE_MAX when the header cannot be read. */
static size_t elf_data_bytes(const void *obj, size_t len) {
  const unsigned char *p = obj;
  if (len < 64 || memcmp(p, "\177ELF", 4) != 0 || p[4] != 2) return (size_t)-1;
  uint64_t shoff;
  uint16_t shentsize, shnum;
  memcpy(&shoff, p + 0x28, 8);
  memcpy(&shentsize, p + 0x3a, 2);
  memcpy(&shnum, p + 0x3c, 2);
  if (shentsize < 64 || shoff > len || (uint64_t)shnum * shentsize > len - shoff) return (size_t)-1;
  size_t total = 0;
  for (int i = 0; i < shnum; i++) {
    const unsigned char *sh = p + shoff + (size_t)i * shentsize;
    uint32_t type;
    uint64_t flags, size;
    memcpy(&type, sh + 4, 4);
    memcpy(&flags, sh + 8, 8);
    memcpy(&size, sh + 32, 8);
    bool alloc = flags & 0x2, exec = flags & 0x4;
    if (alloc && !exec && type != 8 /* SHT_NOBITS */) total += (size_t)size;
  }
  return total;
}

static void test_model(const char *model, const char *needs) {
  if (access(model, R_OK) != 0 || (needs && access(needs, R_OK) != 0)) {
    printf("SKIP %s: %s is missing (run python3 examples/gen_weights.py)\n", model, needs ? needs : model);
    return;
  }
  char path[256];
  snprintf(path, sizeof path, "/tmp/smelt_test_prepack_%d.smelt", (int)getpid());
  smelt_compile_options o = {.targets = "cpu", .no_cache = 1};
  smelt_status st = smelt_compile(model, &o, path);
  if (st) {
    fprintf(stderr, "%s: %s\n", model, st_message(st));
    st_free(st);
    check_failures++;
    return;
  }
  FmtFile *f = NULL;
  CHECK_OK(fmt_file_open(path, &f));
  size_t object = 0, constants = 0;
  const void *obj = NULL;
  int nobjects = 0;
  for (int i = 0; f && i < fmt_file_section_count(f); i++) {
    const FmtSection *sec = fmt_file_section_at(f, i);
    if (sec->kind == FMT_SEC_CPU_OBJECT) object += sec->size, obj = sec->data, nobjects++;
    if (sec->kind == FMT_SEC_CONSTANTS) constants += sec->size;
  }
  printf("test_prepack: %s: cpu-object %zu bytes, constants %zu bytes (%.0f%%)\n", model, object, constants,
         constants ? 100.0 * (double)object / (double)constants : 0.0);
  CHECK(nobjects == 1);
  CHECK(constants > 0);
  /* A copy of the weights would sit in the object's initialised data
   * (.rodata/.data: allocated, not code, not .bss); the code itself grows
   * with the number of kernels and their tiling, not with the weights. */
  size_t data = obj ? elf_data_bytes(obj, object) : 0;
  printf("test_prepack: %s: initialised data in the object %zu bytes (%.1f%% of the constants)\n", model, data,
         constants ? 100.0 * (double)data / (double)constants : 0.0);
  CHECK(data < 0.1 * (double)constants);

  smelt_bundle *b = NULL;
  CHECK_OK(smelt_bundle_open(path, &b));
  if (b && obj) {
    int exports = 0;
    int np = count_prepacks(b, obj, object, &exports);
    printf("test_prepack: %s: %d of %d kernels have a prepack function\n", model, np, rt_bundle_num_kernels(b));
    CHECK(np > 0);
    CHECK(exports == rt_bundle_num_kernels(b) + np);
    run_once(b);
  }
  smelt_bundle_close(b);
  fmt_file_close(f);
  unlink(path);
}

int main(void) {
#ifndef SMELT_HAVE_LLVM
  printf("test_prepack: skipped (built without SMELT_LLVM: no CPU code to look at)\n");
  return 0;
#endif
  test_model("examples/tiny_llama.yaml", "examples/tiny_llama.safetensors");
  test_model("examples/mlp.yaml", NULL);
  test_model("examples/gpt2_block.yaml", NULL);
  return check_done("test_prepack");
}
