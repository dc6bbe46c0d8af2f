/* An unknown CPU name never reaches LLVM (issue 16 #2).
 *
 * LLVM prints "64-bit code requested on a subtarget that doesn't support
 * it!" and aborts the process when it is given a CPU name it does not know.
 * `smelt compile --cpu` and the C API option refuse such names up front
 * (test_capi.c, tests/install); the one other way in is a bundle's
 * manifest, whose `cpu=` names the variant `smelt inspect --source`
 * regenerates LLVM IR for (sc_bundle_kernel_llvm_ir).  A bundle is
 * untrusted input, and one compiled by a newer LLVM may name a CPU this one
 * has never heard of (znver5 for LLVM 14).  Here a bundle compiled for
 * x86-64-v2 is rewritten to name "x86-64-v9" throughout (manifest keys and
 * CPU object sections, the checksums made right again): it still opens and
 * runs, and regenerating its LLVM IR is a clear error naming the CPU, not
 * an abort. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compiler/driver.h"
#include "format/bundle.h"
#include "include/smelt.h"
#include "include/smelt_compile.h"
#include "tests/unit/check.h"

/* s with every `from` replaced by `to` (same length), malloc'd. */
static char *replace_all(const char *s, size_t n, const char *from, const char *to) {
  char *out = malloc(n + 1);
  memcpy(out, s, n);
  out[n] = 0;
  size_t fl = strlen(from);
  for (char *p = out; (p = strstr(p, from)); p += fl) memcpy(p, to, fl);
  return out;
}

/* Copies bundle `in` to `out`, renaming CPU `from` to `to` in the manifest
 * and the CPU object sections' names. */
static int rename_cpu(const char *in, const char *out, const char *from, const char *to) {
  FmtFile *f = NULL;
  FmtWriter *w = NULL;
  smelt_status st = fmt_file_open(in, &f);
  if (!st) st = fmt_writer_create(&w);
  for (int i = 0; !st && i < fmt_file_section_count(f); i++) {
    const FmtSection *s = fmt_file_section_at(f, i);
    char *name = replace_all(s->name, strlen(s->name), from, to);
    if (s->kind == FMT_SEC_MANIFEST) {
      char *text = replace_all(s->data, s->size, from, to);
      st = fmt_writer_add(w, s->kind, name, text, s->size);
      free(text);
    } else {
      st = fmt_writer_add(w, s->kind, s->kind == FMT_SEC_CPU_OBJECT ? name : s->name, s->data, s->size);
    }
    free(name);
  }
  if (!st) st = fmt_writer_write(w, out);
  fmt_writer_destroy(w);
  fmt_file_close(f);
  if (st) fprintf(stderr, "rewriting the bundle: %s\n", st_message(st));
  int ok = st == NULL;
  st_free(st);
  return ok;
}

int main(void) {
#ifndef SMELT_HAVE_LLVM
  printf("SKIP test_cpu_name: smelt was built without LLVM (SMELT_LLVM=OFF)\n");
  return CHECK_SKIPPED;
#else
  char a[64], b[64];
  snprintf(a, sizeof a, "/tmp/smelt_cpu_name_%d_a.smelt", (int)getpid());
  snprintf(b, sizeof b, "/tmp/smelt_cpu_name_%d_b.smelt", (int)getpid());
  smelt_compile_options o = {.cpu = "x86-64-v2", .no_cache = 1};
  CHECK_OK(smelt_compile("examples/mlp.yaml", &o, a));
  CHECK(rename_cpu(a, b, "x86-64-v2", "x86-64-v9"));

  smelt_bundle *bun = NULL;
  CHECK_OK(smelt_bundle_open(b, &bun));
  if (bun) {
    /* the code itself is fine: a session runs it */
    smelt_session *s = NULL;
    CHECK_OK(smelt_session_create(bun, "cpu", NULL, &s));
    smelt_session_destroy(s);
    /* its LLVM IR cannot be regenerated for a CPU this LLVM may not know */
    char *ir = NULL;
    smelt_status st = sc_bundle_kernel_llvm_ir(bun, 0, &ir);
    CHECK(st && smelt_status_code(st) == SMELT_UNSUPPORTED);
    CHECK(st && strstr(smelt_status_message(st), "'x86-64-v9'"));
    CHECK(st && strstr(smelt_status_message(st), "x86-64-v3")); /* the known names */
    if (st) printf("refused: %s\n", smelt_status_message(st));
    smelt_status_free(st);
    free(ir);
    smelt_bundle_close(bun);
  }
  /* the untouched bundle's IR is still there */
  CHECK_OK(smelt_bundle_open(a, &bun));
  if (bun) {
    char *ir = NULL;
    CHECK_OK(sc_bundle_kernel_llvm_ir(bun, 0, &ir));
    CHECK(ir && strstr(ir, "define"));
    free(ir);
    smelt_bundle_close(bun);
  }
  /* and the two front doors refuse the name (exit 2 on the command line is
   * tests/install's and test_capi's) */
  smelt_compile_options bad = {.cpu = "x86-64-v9", .no_cache = 1};
  smelt_status st = smelt_compile("examples/mlp.yaml", &bad, b);
  CHECK(st && smelt_status_code(st) == SMELT_INVALID_INPUT && strstr(smelt_status_message(st), "x86-64-v9"));
  smelt_status_free(st);
  unlink(a);
  unlink(b);
  return check_done("test_cpu_name");
#endif
}
