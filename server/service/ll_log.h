// ll_log.h - the server's log: one line per event on stderr, "llsrv: LEVEL message".
#ifndef LL_LOG_H
#define LL_LOG_H

enum ll_log_level { LL_LOG_ERROR, LL_LOG_WARN, LL_LOG_INFO, LL_LOG_DEBUG };

void ll_log_set_level(int level);
int ll_log_get_level(void);
int ll_log_level_from_name(const char *name); // -1 if unknown
const char *ll_log_level_name(int level);
void ll_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
