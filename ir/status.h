/* Status values: how every library function of smelt reports failure.
 *
 * A status is a pointer: NULL means success, anything else is an owned error
 * object with a code and a formatted message.  The caller that receives a
 * non-NULL status owns it and must either pass it up (RETURN_IF_ERROR) or
 * release it with st_free().  Library code never prints and never exits; only
 * cli/ turns a status into text on the terminal.
 *
 * User errors (bad YAML, bad shapes) are statuses with a message that starts
 * with "file:line:col: error: ..." when the fault has a place in the model.
 * Internal bugs are asserts, not statuses.
 */
#ifndef SMELT_STATUS_H
#define SMELT_STATUS_H

#include <stdarg.h>

typedef enum {
  ST_OK = 0,
  ST_INVALID_INPUT,  /* the user's model, file or argument is wrong */
  ST_IO,             /* a file could not be read or written */
  ST_UNSUPPORTED,    /* valid, but not implemented by this backend */
  ST_NO_MEMORY,
  ST_INTERNAL,
} StatusCode;

typedef struct Status Status;
typedef Status *smelt_status;

#if defined(__GNUC__)
#define SMELT_MUST_USE __attribute__((warn_unused_result))
#define SMELT_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define SMELT_MUST_USE
#define SMELT_PRINTF(a, b)
#endif

/* Creates an error status; the message is formatted like printf. */
smelt_status st_error(StatusCode code, const char *fmt, ...) SMELT_PRINTF(2, 3);
smelt_status st_errorv(StatusCode code, const char *fmt, va_list ap);
/* Prepends "prefix: " to the message of st (which stays owned by the caller). */
smelt_status st_prefix(smelt_status st, const char *fmt, ...) SMELT_PRINTF(2, 3);
StatusCode st_code(const Status *st);
const char *st_message(const Status *st);
void st_free(smelt_status st);

#define RETURN_IF_ERROR(expr)          \
  do {                                 \
    smelt_status st_tmp_ = (expr);     \
    if (st_tmp_) return st_tmp_;       \
  } while (0)

/* A source position in the user's model file (1-based; 0 = unknown). */
typedef struct {
  const char *file;
  int line, col;
} SrcLoc;

/* An error located in the model: "file:line:col: error: <message>". */
smelt_status st_at(SrcLoc loc, const char *fmt, ...) SMELT_PRINTF(2, 3);

#endif
