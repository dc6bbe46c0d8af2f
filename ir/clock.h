/* A monotonic clock in seconds, for timings (benchmarks, --time, the
 * tuner's budget). */
#ifndef SMELT_IR_CLOCK_H
#define SMELT_IR_CLOCK_H

#include <time.h>

static inline double smelt_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
