/* Flag parsing and error reporting shared by the subcommands. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

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
    if (strchr(eq + 1, ','))
      return cli_usage(cmd, "--dim %s: several values make several specialisations, which need the bundle "
                            "(not built yet); give one value", v), 2;
    if (mo->ndims == (int)(sizeof mo->dims / sizeof mo->dims[0])) return cli_usage(cmd, "too many --dim flags"), 2;
    int64_t val;
    if (!parse_i64(eq + 1, &val)) return cli_usage(cmd, "--dim %s: '%s' is not an integer", v, eq + 1), 2;
    mo->dims[mo->ndims].name = strndup(v, (size_t)(eq - v));
    mo->dims[mo->ndims++].value = val;
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
  return fe_load_yaml(path, &fo, out);
}
