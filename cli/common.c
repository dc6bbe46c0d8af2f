/* Flag parsing and error reporting shared by the subcommands. */
#include <errno.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"

extern char **environ;

int cli_usage(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "smelt %s: ", cmd);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n(see 'smelt %s --help')\n", cmd);
  va_end(ap);
  return 2;
}

int cli_fail(smelt_status st) {
  fprintf(stderr, "%s\n", st_message(st));
  st_free(st);
  return 1;
}

const char *cli_flag_value(const char *flag, int argc, char **argv, int *i, bool *missing) {
  size_t n = strlen(flag);
  const char *a = argv[*i];
  *missing = false;
  if (strncmp(a, flag, n) != 0) return NULL;
  if (a[n] == '=') return a + n + 1;
  if (a[n] != 0) return NULL;
  if (*i + 1 >= argc) {
    *missing = true;
    return NULL;
  }
  return argv[++*i];
}

static bool parse_i64(const char *s, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end) return false;
  *out = v;
  return true;
}

int cli_model_opt(const char *cmd, int argc, char **argv, int *i, ModelOpts *mo) {
  bool missing;
  const char *v;
  if ((v = cli_flag_value("--dim", argc, argv, i, &missing)) || missing) {
    if (missing) return cli_usage(cmd, "--dim needs NAME=VALUE"), 2;
    const char *eq = strchr(v, '=');
    if (!eq || eq == v) return cli_usage(cmd, "--dim needs NAME=VALUE, got '%s'", v), 2;
    /* Several values ("seq=1,16,64") make specialisations: each is kept as
     * an entry of its own under the same name, in order; the commands that
     * take one value per dim refuse repeated names (cli_dims_several). */
    for (const char *p = eq + 1;;) {
      size_t n = strcspn(p, ",");
      char num[64];
      int64_t val, hi = 0;
      snprintf(num, sizeof num, "%.*s", (int)(n < sizeof num ? n : sizeof num - 1), p);
      char *dots = strstr(num, "..");
      /* a range "1..2048": one specialisation for every value in it */
      if (dots) *dots = 0;
      if (n == 0 || n >= sizeof num || !parse_i64(num, &val) || (dots && (!parse_i64(dots + 2, &hi) || hi <= val)))
        return cli_usage(cmd, "--dim %s: '%.*s' is not an integer or a range A..B (A < B)", v, (int)n, p), 2;
      if (mo->ndims == (int)(sizeof mo->dims / sizeof mo->dims[0])) return cli_usage(cmd, "too many --dim values"), 2;
      mo->dims[mo->ndims].name = strndup(v, (size_t)(eq - v));
      mo->dims[mo->ndims].max = hi;
      mo->dims[mo->ndims++].value = val;
      if (!p[n]) break;
      p += n + 1;
    }
    return 1;
  }
  if ((v = cli_flag_value("--dtype", argc, argv, i, &missing)) || missing) {
    if (missing) return cli_usage(cmd, "--dtype needs a dtype"), 2;
    mo->dtype = dt_from_name(v);
    if (mo->dtype == DT_INVALID) return cli_usage(cmd, "unknown dtype '%s'", v), 2;
    return 1;
  }
  return 0;
}

smelt_status cli_load_model(const char *path, const ModelOpts *mo, Graph **out) {
  FeOptions fo = {.dims = mo->dims, .ndims = mo->ndims, .dtype = mo->dtype};
  return fe_load_model(path, &fo, out);
}

const char *cli_default_tune_table(void) {
  const char *env = getenv("SMELT_TUNE_TABLE");
  if (env && *env) return env;
#ifdef SMELT_DEFAULT_TUNE_TABLE
  if (access(SMELT_DEFAULT_TUNE_TABLE, R_OK) == 0) return SMELT_DEFAULT_TUNE_TABLE;
#endif
  return NULL;
}

/* Writes g as Graphviz DOT to path, or as SVG through `dot -Tsvg` when the
 * path ends in .svg. */
smelt_status cli_write_graph(const Graph *g, const char *path) {
  size_t n = strlen(path);
  bool svg = n > 4 && strcmp(path + n - 4, ".svg") == 0;
  char dot_path[4200];
  snprintf(dot_path, sizeof dot_path, svg ? "%s.dot.tmp" : "%s", path);
  FILE *f = fopen(dot_path, "w");
  if (!f) return st_error(ST_IO, "%s: error: cannot write the graph", dot_path);
  ir_print_dot(f, g);
  if (fclose(f) != 0) return st_error(ST_IO, "%s: error: write failed", dot_path);
  if (!svg) return NULL;
  pid_t pid;
  char *const args[] = {"dot", "-Tsvg", "-o", (char *)path, dot_path, NULL};
  int rc = posix_spawnp(&pid, "dot", NULL, NULL, args, environ), status = 0;
  if (rc == 0 && waitpid(pid, &status, 0) < 0) rc = errno;
  remove(dot_path);
  if (rc != 0)
    return st_error(ST_UNSUPPORTED, "%s: error: SVG needs Graphviz's `dot`, which could not be run (%s); write a .dot "
                    "file instead, or install graphviz", path, strerror(rc));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return st_error(ST_IO, "%s: error: `dot -Tsvg` failed (status %d)", path, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  return NULL;
}

/* The size of the axis an integer input indexes when a gather reads it as
 * its indices (token ids into an embedding), else 0. */
int64_t cli_gather_range(const Graph *g, int v, const char **out_node) {
  for (int i = 0; i < g->nnode; i++) {
    const Node *n = &g->node[i];
    if (n->dead || n->op != OP_GATHER || n->nin < 2 || n->in[1] != v) continue;
    const TensorType *d = &g->val[n->in[0]].type;
    int ax = ir_norm_axis(ir_attr_int(n, "axis"), d->rank);
    *out_node = ir_node_name(g, n);
    return ax >= 0 ? d->dim[ax] : 0;
  }
  return 0;
}

bool cli_dims_several(const ModelOpts *mo) {
  for (int i = 0; i < mo->ndims; i++)
    for (int j = 0; j < i; j++)
      if (strcmp(mo->dims[i].name, mo->dims[j].name) == 0) return true;
  return false;
}

int cli_cuda_devices(const char *d) {
  int n = 0;
  for (const char *p = d; p && *p;) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    bool plain = len == 4 && strncmp(p, "cuda", 4) == 0;
    bool numbered = len > 5 && strncmp(p, "cuda:", 5) == 0 && strspn(p + 5, "0123456789") >= len - 5;
    if (!(plain && !end && n == 0) && !numbered) return 0;
    n++;
    if (end && !end[1]) return 0;
    p += len + (end ? 1 : 0);
  }
  return n;
}

int cli_devices_tp(const char *cmd, const char *device, bool model, int *tp) {
  int ndev = cli_cuda_devices(device);
  if (ndev <= 1 || !model) return 0;
  if (*tp == 1) *tp = ndev; /* --devices cuda:0,cuda:1: one rank a GPU */
  return *tp == ndev ? 0 : cli_usage(cmd, "--tp %d with %d devices: give one device a rank", *tp, ndev);
}

bool cli_parse_tp(const char *s, int *out) {
  char *end;
  long v = s ? strtol(s, &end, 10) : 0;
  if (!s || *end || v < 1 || v > 64) return false;
  *out = (int)v;
  return true;
}
