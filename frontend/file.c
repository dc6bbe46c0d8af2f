/* Whole-file reads for the importers.  Every input file of the frontend is
 * small next to memory (a model, a header, a weights file that will be
 * copied into the graph anyway), so reading it at once keeps the parsers
 * free of I/O and makes every offset check a comparison against one size. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fe_internal.h"

smelt_status fe_read_file(const char *path, size_t max_bytes, unsigned char **out_buf, size_t *out_size) {
  *out_buf = NULL;
  *out_size = 0;
  FILE *f = fopen(path, "rb");
  if (!f) return st_error(ST_IO, "cannot open: %s", strerror(errno));
  /* fopen succeeds on a directory; fstat tells it apart before reading. */
  struct stat sb;
  if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
    fclose(f);
    return st_error(ST_IO, "cannot read: not a regular file");
  }
  if ((unsigned long long)sb.st_size > max_bytes) {
    fclose(f);
    return st_error(ST_IO, "file is too large (%lld bytes, at most %zu)", (long long)sb.st_size, max_bytes);
  }
  size_t size = (size_t)sb.st_size;
  unsigned char *buf = malloc(size + 1);
  if (!buf) {
    fclose(f);
    return st_error(ST_NO_MEMORY, "out of memory reading %zu bytes", size);
  }
  size_t got = fread(buf, 1, size, f);
  int err = ferror(f) ? errno : 0;
  fclose(f);
  if (got != size) {
    free(buf);
    return st_error(ST_IO, "cannot read: %s", err ? strerror(err) : "file changed while reading");
  }
  buf[size] = 0;
  *out_buf = buf;
  *out_size = size;
  return NULL;
}
