// ll_error.h - error codes shared by every layer (libuv style: 0 or a negative code).
//
// Functions return 0 (LL_OK) or one of the negative codes below. Where a code is not
// enough, the caller passes `char *err, size_t errlen` and gets a sentence naming what
// was wrong (field, offset, key ...). ll_strerror() never returns NULL.
#ifndef LL_ERROR_H
#define LL_ERROR_H

#include <stddef.h>

enum ll_error {
  LL_OK = 0,
  LL_EINVAL = -1,       // invalid argument (caller bug or bad user option)
  LL_ENOMEM = -2,       // allocation failed
  LL_EIO = -3,          // read/write/open/fsync failed (errno kept in the message)
  LL_EFORMAT = -4,      // malformed file or message
  LL_ETRUNC = -5,       // input ends before the structure does
  LL_ELIMIT = -6,       // a count or size exceeds a configured or sane limit
  LL_ECHECKSUM = -7,    // content checksum mismatch
  LL_EUNSUPPORTED = -8, // well-formed but not supported (tensor type, architecture ...)
  LL_ENOTFOUND = -9,    // key, tensor, file not present
  LL_EBUSY = -10,       // queue full / resource in use
  LL_ECANCELED = -11,   // operation canceled
  LL_EEXIST = -12,      // already exists / duplicate
  LL_EOVERFLOW = -13,   // arithmetic overflow in a size computation
  LL_ESTATE = -14,      // operation not valid in the current state
};

const char *ll_strerror(int code);

// Format a message into err (if err != NULL and errlen > 0). Returns `code` so callers can
// write `return ll_errf(err, errlen, LL_EFORMAT, "gguf: bad magic at offset 0");`.
int ll_errf(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
