// multipart.c - multipart/form-data bodies (ll_multipart.h).
#include "ll_multipart.h"

#include <string.h>
#include <strings.h>

#include "ll_error.h"

static int is_tspecial_end(char c) { return c == ';' || c == ' ' || c == '\t' || c == ','; }

int ll_multipart_boundary(const char *ct, size_t ctlen, const char **b, size_t *blen, char *err, size_t errlen) {
  static const char mf[] = "multipart/form-data";
  if (ctlen < sizeof mf - 1 || strncasecmp(ct, mf, sizeof mf - 1) != 0)
    return ll_errf(err, errlen, LL_EFORMAT, "the upload must be multipart/form-data (Content-Type: %.*s)", (int)(ctlen < 80 ? ctlen : 80), ct);
  for (size_t i = sizeof mf - 1; i + 9 <= ctlen; i++) {
    if (strncasecmp(ct + i, "boundary=", 9) != 0 || (i > 0 && ct[i - 1] != ';' && ct[i - 1] != ' ' && ct[i - 1] != '\t')) continue;
    size_t s = i + 9, e;
    if (s < ctlen && ct[s] == '"') {
      s++;
      for (e = s; e < ctlen && ct[e] != '"'; e++) {
      }
      if (e >= ctlen) return ll_errf(err, errlen, LL_EFORMAT, "the Content-Type's boundary has no closing quote");
    } else {
      for (e = s; e < ctlen && !is_tspecial_end(ct[e]); e++) {
      }
    }
    if (e == s || e - s > LL_MULTIPART_MAX_BOUNDARY)
      return ll_errf(err, errlen, LL_EFORMAT, "the Content-Type's boundary must be 1..%d bytes", LL_MULTIPART_MAX_BOUNDARY);
    *b = ct + s;
    *blen = e - s;
    return 0;
  }
  return ll_errf(err, errlen, LL_EFORMAT, "the Content-Type multipart/form-data has no boundary= parameter");
}

static const char *find(const char *h, size_t hn, const char *nd, size_t nn) {
  if (nn == 0 || hn < nn) return NULL;
  for (const char *p = h, *end = h + hn - nn + 1; p < end;) {
    const char *q = memchr(p, nd[0], (size_t)(end - p));
    if (!q) return NULL;
    if (memcmp(q, nd, nn) == 0) return q;
    p = q + 1;
  }
  return NULL;
}

// A parameter of a Content-Disposition value: name="x" or name=x. 1 found, 0 not, -1 bad.
static int disp_param(const char *v, size_t n, const char *key, const char **out, size_t *olen) {
  const size_t kl = strlen(key);
  for (size_t i = 0; i + kl + 1 <= n; i++) {
    if (i > 0 && v[i - 1] != ';' && v[i - 1] != ' ' && v[i - 1] != '\t') continue;
    if (strncasecmp(v + i, key, kl) != 0 || v[i + kl] != '=') continue;
    size_t s = i + kl + 1, e;
    if (s < n && v[s] == '"') {
      s++;
      for (e = s; e < n && v[e] != '"'; e++)
        if (v[e] == '\\' && e + 1 < n) e++;
      if (e >= n) return -1;
    } else {
      for (e = s; e < n && !is_tspecial_end(v[e]); e++) {
      }
    }
    *out = v + s;
    *olen = e - s;
    return 1;
  }
  return 0;
}

// One part's headers h[0..hn) (CRLF-separated lines): its Content-Disposition.
static int part_headers(const char *h, size_t hn, struct ll_multipart_part *p, size_t at, char *err, size_t errlen) {
  int have = 0;
  for (size_t i = 0; i < hn;) {
    const char *eol = find(h + i, hn - i, "\r\n", 2);
    size_t ln = eol ? (size_t)(eol - (h + i)) : hn - i;
    const char *line = h + i;
    static const char cd[] = "content-disposition:";
    if (ln >= sizeof cd - 1 && strncasecmp(line, cd, sizeof cd - 1) == 0) {
      const char *v = line + sizeof cd - 1;
      size_t vn = ln - (sizeof cd - 1);
      while (vn && (*v == ' ' || *v == '\t')) v++, vn--;
      if (vn < 9 || strncasecmp(v, "form-data", 9) != 0)
        return ll_errf(err, errlen, LL_EFORMAT, "multipart part at byte %zu: Content-Disposition is not form-data", at);
      int r = disp_param(v, vn, "name", &p->name, &p->name_len);
      if (r <= 0) return ll_errf(err, errlen, LL_EFORMAT, "multipart part at byte %zu: Content-Disposition has no name", at);
      r = disp_param(v, vn, "filename", &p->filename, &p->filename_len);
      if (r < 0) return ll_errf(err, errlen, LL_EFORMAT, "multipart part at byte %zu: a filename without its closing quote", at);
      if (r == 0) p->filename = NULL, p->filename_len = 0;
      have = 1;
    }
    i += ln + (eol ? 2 : 0);
  }
  if (!have) return ll_errf(err, errlen, LL_EFORMAT, "multipart part at byte %zu has no Content-Disposition header", at);
  return 0;
}

int ll_multipart_parse(const char *body, size_t len, const char *boundary, size_t blen, struct ll_multipart_part *parts, int *n,
                       char *err, size_t errlen) {
  *n = 0;
  if (blen == 0 || blen > LL_MULTIPART_MAX_BOUNDARY) return ll_errf(err, errlen, LL_EFORMAT, "multipart: bad boundary length");
  char delim[LL_MULTIPART_MAX_BOUNDARY + 4];
  delim[0] = '\r', delim[1] = '\n', delim[2] = '-', delim[3] = '-';
  memcpy(delim + 4, boundary, blen);
  const size_t dl = blen + 4;
  // The first delimiter may open the body without its CRLF.
  size_t pos;
  if (len >= dl - 2 && memcmp(body, delim + 2, dl - 2) == 0) {
    pos = dl - 2;
  } else {
    const char *f = find(body, len, delim, dl);
    if (!f) return ll_errf(err, errlen, LL_EFORMAT, "multipart: the body has no boundary line (--%.*s)", (int)blen, boundary);
    pos = (size_t)(f - body) + dl;
  }
  for (;;) {
    // After a delimiter: "--" closes the body, else optional whitespace then CRLF.
    if (pos + 2 <= len && body[pos] == '-' && body[pos + 1] == '-') return *n ? 0 : ll_errf(err, errlen, LL_EFORMAT, "multipart: no parts");
    while (pos < len && (body[pos] == ' ' || body[pos] == '\t')) pos++;
    if (pos + 2 > len || body[pos] != '\r' || body[pos + 1] != '\n')
      return ll_errf(err, errlen, LL_EFORMAT, "multipart: the boundary line at byte %zu does not end with CRLF", pos);
    pos += 2;
    const size_t hmax = len - pos < LL_MULTIPART_MAX_HEADERS + 4 ? len - pos : LL_MULTIPART_MAX_HEADERS + 4;
    const char *he = find(body + pos, hmax, "\r\n\r\n", 4);
    size_t hn;
    if (pos + 2 <= len && body[pos] == '\r' && body[pos + 1] == '\n') {
      hn = 0; // no headers at all
    } else if (!he) {
      return hmax > LL_MULTIPART_MAX_HEADERS ? ll_errf(err, errlen, LL_ELIMIT, "multipart part at byte %zu: headers over %d bytes", pos, LL_MULTIPART_MAX_HEADERS)
                                             : ll_errf(err, errlen, LL_EFORMAT, "multipart part at byte %zu: headers do not end (CRLF CRLF)", pos);
    } else {
      hn = (size_t)(he - (body + pos));
    }
    if (*n == LL_MULTIPART_MAX_PARTS) return ll_errf(err, errlen, LL_ELIMIT, "multipart: more than %d parts", LL_MULTIPART_MAX_PARTS);
    struct ll_multipart_part *p = &parts[*n];
    memset(p, 0, sizeof *p);
    int rc = part_headers(body + pos, hn, p, pos, err, errlen);
    if (rc) return rc;
    const size_t ds = pos + hn + (hn ? 4 : 2);
    const char *e = find(body + ds, len - ds, delim, dl);
    if (!e) return ll_errf(err, errlen, LL_EFORMAT, "multipart part at byte %zu: no closing boundary (the body is cut short?)", pos);
    p->data = body + ds;
    p->len = (size_t)(e - (body + ds));
    (*n)++;
    pos = (size_t)(e - body) + dl;
  }
}

const struct ll_multipart_part *ll_multipart_find(const struct ll_multipart_part *parts, int n, const char *name) {
  const size_t nl = strlen(name);
  for (int i = 0; i < n; i++)
    if (parts[i].name_len == nl && memcmp(parts[i].name, name, nl) == 0) return &parts[i];
  return NULL;
}
