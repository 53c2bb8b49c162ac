// error.c - error code names and the message helper.
#include "ll_error.h"

#include <stdarg.h>
#include <stdio.h>

const char *ll_strerror(int code) {
  switch (code) {
  case LL_OK: return "success";
  case LL_EINVAL: return "invalid argument";
  case LL_ENOMEM: return "out of memory";
  case LL_EIO: return "I/O error";
  case LL_EFORMAT: return "malformed input";
  case LL_ETRUNC: return "truncated input";
  case LL_ELIMIT: return "limit exceeded";
  case LL_ECHECKSUM: return "checksum mismatch";
  case LL_EUNSUPPORTED: return "unsupported";
  case LL_ENOTFOUND: return "not found";
  case LL_EBUSY: return "busy";
  case LL_ECANCELED: return "canceled";
  case LL_EEXIST: return "already exists";
  case LL_EOVERFLOW: return "size overflow";
  case LL_ESTATE: return "invalid state";
  default: return "unknown error";
  }
}

int ll_errf(char *err, size_t errlen, int code, const char *fmt, ...) {
  if (err && errlen > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return code;
}
