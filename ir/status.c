/* Status objects: a code and a heap-allocated message.  Allocation failure
 * while building an error falls back to a static out-of-memory status, so
 * error paths themselves cannot fail. */
#include "status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct Status {
  StatusCode code;
  char *msg;
  int is_static;
};

static Status oom_status = {ST_NO_MEMORY, "out of memory", 1};

smelt_status st_errorv(StatusCode code, const char *fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  Status *st = malloc(sizeof *st);
  char *msg = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (!st || !msg) {
    free(st);
    free(msg);
    return &oom_status;
  }
  vsnprintf(msg, (size_t)n + 1, fmt, ap);
  st->code = code;
  st->msg = msg;
  st->is_static = 0;
  return st;
}

smelt_status st_error(StatusCode code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  smelt_status st = st_errorv(code, fmt, ap);
  va_end(ap);
  return st;
}

smelt_status st_prefix(smelt_status st, const char *fmt, ...) {
  if (!st || st->is_static) return st;
  char pre[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(pre, sizeof pre, fmt, ap);
  va_end(ap);
  size_t n = strlen(pre) + 2 + strlen(st->msg) + 1;
  char *msg = malloc(n);
  if (!msg) return st;
  snprintf(msg, n, "%s: %s", pre, st->msg);
  free(st->msg);
  st->msg = msg;
  return st;
}

smelt_status st_at(SrcLoc loc, const char *fmt, ...) {
  char body[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(body, sizeof body, fmt, ap);
  va_end(ap);
  if (loc.file && loc.line > 0)
    return st_error(ST_INVALID_INPUT, "%s:%d:%d: error: %s", loc.file, loc.line, loc.col, body);
  if (loc.file) return st_error(ST_INVALID_INPUT, "%s: error: %s", loc.file, body);
  return st_error(ST_INVALID_INPUT, "error: %s", body);
}

StatusCode st_code(const Status *st) { return st ? st->code : ST_OK; }
const char *st_message(const Status *st) { return st ? st->msg : "ok"; }

void st_free(smelt_status st) {
  if (!st || st->is_static) return;
  free(st->msg);
  free(st);
}
