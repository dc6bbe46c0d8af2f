/* The shared part of the fuzz targets: a private directory for the inputs
 * and the oracle's checks (fuzz.h). */
#define _DEFAULT_SOURCE /* mkdtemp */
#include "fuzz.h"

#include <sys/stat.h>
#include <unistd.h>

static char dir[256];
#define MAX_FILES 8
static char *files[MAX_FILES]; /* the names written, for the cleanup */
static int nfiles;

static void cleanup(void) {
  for (int i = 0; i < nfiles; i++) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, files[i]);
    unlink(path);
    free(files[i]);
  }
  rmdir(dir);
}

static void make_dir(void) {
  struct stat sb;
  const char *base = getenv("TMPDIR");
  if (!base || !*base) base = stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) ? "/dev/shm" : "/tmp";
  snprintf(dir, sizeof dir, "%s/smelt-fuzz-XXXXXX", base);
  if (!mkdtemp(dir)) {
    perror("fuzz: mkdtemp");
    abort();
  }
  atexit(cleanup);
}

const char *fuzz_put(const char *name, const void *data, size_t size) {
  static char path[512];
  if (!dir[0]) make_dir();
  int known = 0;
  for (int i = 0; i < nfiles; i++) known |= !strcmp(files[i], name);
  if (!known) {
    if (nfiles == MAX_FILES || !(files[nfiles] = strdup(name))) abort();
    nfiles++;
  }
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
    perror("fuzz: writing the input");
    abort();
  }
  return path;
}

void fuzz_fail(const char *rule, const char *detail) {
  fprintf(stderr, "fuzz: broken rule: %s\n  %s\n", rule, detail ? detail : "");
  abort();
}

char fuzz_last_error[1024];

void fuzz_check_error(smelt_status st, const char *path) {
  if (!st) return;
  const char *msg = st_message(st);
  if (!msg || !*msg) fuzz_fail("an error has a message", "(empty message)");
  size_t used = strlen(fuzz_last_error);
  if (used + 4 < sizeof fuzz_last_error) /* each since it was emptied */
    snprintf(fuzz_last_error + used, sizeof fuzz_last_error - used, "%s%s", used ? " | " : "", msg);
  if (getenv("FUZZ_VERBOSE")) fprintf(stderr, "fuzz: error: %s\n", msg);
  if (st_code(st) == ST_INTERNAL) fuzz_fail("input cannot cause ST_INTERNAL", msg);
  if (path && st_code(st) == ST_INVALID_INPUT && !strstr(msg, path))
    fuzz_fail("an ST_INVALID_INPUT message names the file", msg);
  st_free(st);
}

void fuzz_check_graph(const Graph *g) {
  smelt_status st = ir_verify(g);
  if (st) fuzz_fail("what a frontend accepts passes ir_verify", st_message(st));
  free(ir_print_str(g));
}
