/* A main() for a fuzz target without libFuzzer, so that the normal and the
 * sanitizer test suites run every committed input through the target's
 * oracle (fuzz.h): the seeds (corpus/NAME) and the regression inputs of
 * crashes the fuzzers found (regress/NAME), each fixed since.
 *
 *   replay_NAME [--ok] FILE|DIR...
 *
 * A regression input FILE may come with FILE.expect, one line: the text
 * its error message must contain, or "ok" when the input must be accepted,
 * so that a fix that merely stops the crash in some other way is noticed.
 * After --ok, every input without a .expect must be accepted: the bundle
 * and object seeds, which go stale when a format changes (and then stop at
 * a version check, a shallow place to fuzz from). */
#define _DEFAULT_SOURCE /* DT_DIR */
#include <dirent.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int failures, inputs;
static bool all_ok; /* --ok seen */

static unsigned char *slurp(const char *path, size_t *out_n) {
  FILE *f = fopen(path, "rb");
  unsigned char *buf = NULL;
  size_t n = 0, cap = 0;
  if (!f) return NULL;
  for (;;) {
    if (n == cap) {
      unsigned char *nb = realloc(buf, cap = cap ? 2 * cap : 4096);
      if (!nb) break;
      buf = nb;
    }
    size_t k = fread(buf + n, 1, cap - n, f);
    if (!k) break;
    n += k;
  }
  fclose(f);
  *out_n = n;
  return buf;
}

static void replay_file(const char *path) {
  size_t n = 0;
  unsigned char *data = slurp(path, &n);
  if (!data) {
    fprintf(stderr, "replay: cannot read %s\n", path);
    failures++;
    return;
  }
  fuzz_last_error[0] = 0;
  LLVMFuzzerTestOneInput(data, n);
  free(data);
  inputs++;
  char epath[1024];
  snprintf(epath, sizeof epath, "%s.expect", path);
  size_t en = 0;
  char *expect = (char *)slurp(epath, &en);
  if (!expect && all_ok && fuzz_last_error[0]) {
    fprintf(stderr, "replay: %s: a seed that must be accepted failed: %s\n  (after a format change, make the seeds "
            "again: python3 tests/fuzz/make_seeds.py --smelt BUILD/smelt)\n", path, fuzz_last_error);
    failures++;
  }
  if (!expect) return;
  while (en && (expect[en - 1] == '\n' || expect[en - 1] == '\r')) en--;
  expect[en] = 0; /* slurp leaves room: cap > n */
  bool ok_expected = !strcmp(expect, "ok");
  if (ok_expected ? fuzz_last_error[0] != 0 : !strstr(fuzz_last_error, expect)) {
    fprintf(stderr, "replay: %s: expected %s%s%s, got %s\n", path, ok_expected ? "" : "an error containing '",
            ok_expected ? "success" : expect, ok_expected ? "" : "'",
            fuzz_last_error[0] ? fuzz_last_error : "success");
    failures++;
  }
  free(expect);
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void replay_path(const char *path) {
  struct stat sb;
  if (stat(path, &sb) != 0) {
    fprintf(stderr, "replay: no %s\n", path);
    failures++;
    return;
  }
  if (!S_ISDIR(sb.st_mode)) {
    replay_file(path);
    return;
  }
  DIR *d = opendir(path);
  if (!d) {
    failures++;
    return;
  }
  char **names = NULL;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    size_t len = strlen(e->d_name);
    if (e->d_name[0] == '.' || (len > 7 && !strcmp(e->d_name + len - 7, ".expect"))) continue;
    char **nn = realloc(names, sizeof *names * (size_t)(n + 1));
    if (!nn) break;
    names = nn;
    names[n] = malloc(strlen(path) + len + 2);
    if (!names[n]) break;
    sprintf(names[n++], "%s/%s", path, e->d_name);
  }
  closedir(d);
  qsort(names, (size_t)n, sizeof *names, by_name); /* the same order everywhere */
  for (int i = 0; i < n; i++) {
    replay_file(names[i]);
    free(names[i]);
  }
  free(names);
}

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define REPLAY_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define REPLAY_ASAN 1
#endif

int main(int argc, char **argv) {
  /* The inputs are small: a reader that asks for gigabytes for one of them
   * trusted a size it should have checked against the data (libFuzzer's
   * -malloc_limit_mb, here).  Not under ASan, which reserves terabytes of
   * address space for its shadow memory. */
#ifndef REPLAY_ASAN
  struct rlimit rl = {(rlim_t)4 << 30, (rlim_t)4 << 30};
  setrlimit(RLIMIT_AS, &rl);
#endif
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--ok")) all_ok = true;
    else replay_path(argv[i]);
  }
  printf("%s: %d inputs, %d failures\n", argv[0], inputs, failures);
  return failures ? 1 : 0;
}
