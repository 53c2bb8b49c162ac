// log.c - leveled log lines on stderr (the level can change at run time from the monitor).
#include "ll_log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static atomic_int g_level = LL_LOG_INFO;
static const char *names[] = {"error", "warn", "info", "debug"};

void ll_log_set_level(int level) { atomic_store(&g_level, level); }
int ll_log_get_level(void) { return atomic_load(&g_level); }
int ll_log_level_from_name(const char *name) {
  for (int i = 0; i < 4; i++)
    if (name && strcmp(name, names[i]) == 0) return i;
  return -1;
}
const char *ll_log_level_name(int level) { return level >= 0 && level < 4 ? names[level] : "?"; }

void ll_log(int level, const char *fmt, ...) {
  if (level > atomic_load(&g_level)) return;
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  // One fprintf per line: lines from threads do not interleave.
  fprintf(stderr, "%02d:%02d:%02d.%03ld llsrv %-5s %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, names[level], buf);
}
