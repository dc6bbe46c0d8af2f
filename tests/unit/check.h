/* A minimal unit-test harness: CHECK records a failure and carries on,
 * CHECK_OK fails on a non-NULL status and prints its message, and
 * check_done() returns the exit status. */
#ifndef SMELT_CHECK_H
#define SMELT_CHECK_H

#include <math.h>
#include <stdio.h>

#include "ir/status.h"

static int check_failures;

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      check_failures++;                                                    \
    }                                                                      \
  } while (0)

#define CHECK_OK(expr)                                                              \
  do {                                                                              \
    smelt_status st_c_ = (expr);                                                    \
    if (st_c_) {                                                                    \
      fprintf(stderr, "%s:%d: unexpected error: %s\n", __FILE__, __LINE__, st_message(st_c_)); \
      st_free(st_c_);                                                               \
      check_failures++;                                                             \
    }                                                                               \
  } while (0)

#define CHECK_NEAR(a, b, tol) CHECK(fabs((double)(a) - (double)(b)) <= (tol))

static inline int check_done(const char *name) {
  if (check_failures) fprintf(stderr, "%s: %d check(s) failed\n", name, check_failures);
  else printf("%s: ok\n", name);
  return check_failures ? 1 : 0;
}

#endif
