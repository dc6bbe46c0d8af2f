/* A minimal unit-test harness: CHECK records a failure and carries on,
 * CHECK_OK fails on a non-NULL status and prints its message, and
 * check_done() returns the exit status.
 *
 * Skips: a test that could not run at all (no GPU, no LLVM) prints a SKIP
 * line and exits CHECK_SKIPPED, which CMakeLists.txt declares as ctest's
 * SKIP_RETURN_CODE, so ctest reports it as skipped instead of passed.  A
 * test that ran but left a part out prints a SKIP line and goes on; where
 * the part needs a capability named in $SMELT_TEST_REQUIRE (a comma list,
 * "nvrtc", "llvm"; scripts/test.sh sets it for CI), check_skip_part counts it
 * as a failure instead, since that part must run there. */
#ifndef SMELT_CHECK_H
#define SMELT_CHECK_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* The exit status of a test that skipped as a whole (ctest's SKIP_RETURN_CODE). */
#define CHECK_SKIPPED 77

/* Whether $SMELT_TEST_REQUIRE names capability. */
static inline bool check_required(const char *capability) {
  const char *req = getenv("SMELT_TEST_REQUIRE");
  size_t n = strlen(capability);
  for (const char *p = req; p && *p;) {
    size_t len = strcspn(p, ",");
    if (len == n && !strncmp(p, capability, n)) return true;
    p += len;
    if (*p) p++;
  }
  return false;
}

/* A part of the test left out for want of capability: a SKIP line, or a
 * failure where $SMELT_TEST_REQUIRE says the capability must be there. */
static inline void check_skip_part(const char *capability, const char *line) {
  if (check_required(capability)) {
    fprintf(stderr, "FAIL (SMELT_TEST_REQUIRE=%s): %s\n", getenv("SMELT_TEST_REQUIRE"), line);
    check_failures++;
  } else {
    printf("SKIP: %s\n", line);
  }
}

static inline int check_done(const char *name) {
  if (check_failures) fprintf(stderr, "%s: %d check(s) failed\n", name, check_failures);
  else printf("%s: ok\n", name);
  return check_failures ? 1 : 0;
}

#endif
