/* Flag helpers: the tolerances of --check.
 */
#include <math.h>
#include <stdlib.h>

#include "cli.h"

bool cli_parse_tolerance(const char *s, double *out) {
  if (!s || !*s) return false;
  char *end;
  double v = strtod(s, &end);
  if (*end || !isfinite(v) || v < 0) return false;
  *out = v;
  return true;
}
