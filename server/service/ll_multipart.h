// ll_multipart.h - a multipart/form-data body (RFC 7578) split into its parts, for the HTTP
// API's file upload (POST /v1/files). Pure functions on (buf, len): no allocation, the parts
// point into the body; fuzzed by fuzz_multipart.
#ifndef LL_MULTIPART_H
#define LL_MULTIPART_H

#include <stddef.h>

#define LL_MULTIPART_MAX_PARTS 16
#define LL_MULTIPART_MAX_BOUNDARY 70 // RFC 2046
#define LL_MULTIPART_MAX_HEADERS 8192 // bytes of one part's headers

struct ll_multipart_part {
  const char *name;     // the form field's name (Content-Disposition name=), not NUL-terminated
  size_t name_len;
  const char *filename; // filename= or NULL
  size_t filename_len;
  const char *data;     // the part's bytes
  size_t len;
};

// The boundary of a Content-Type header value "multipart/form-data; boundary=B" (B quoted or
// not): 0 with *b / *blen pointing into ct, or LL_EFORMAT with the reason in err.
int ll_multipart_boundary(const char *ct, size_t ctlen, const char **b, size_t *blen, char *err, size_t errlen);
// Splits body into at most LL_MULTIPART_MAX_PARTS parts (*n of them): 0, or LL_EFORMAT /
// LL_ELIMIT with what is wrong (and at which byte) in err. A part without a form-data
// Content-Disposition naming it is refused; the preamble and epilogue are ignored.
int ll_multipart_parse(const char *body, size_t len, const char *boundary, size_t blen, struct ll_multipart_part *parts, int *n,
                       char *err, size_t errlen);
// The part named `name`, or NULL.
const struct ll_multipart_part *ll_multipart_find(const struct ll_multipart_part *parts, int n, const char *name);

#endif
