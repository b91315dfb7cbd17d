/*
 * log: key=value lines on stderr, one per event:
 *   ts=2026-01-01T00:00:00.123Z level=info event=prepared txn=t1 vms=2
 * log_warn appends err="strerror(errno)"; log_warnx does not.
 * fatal/fatalx log and exit(1).  Thread-safe (one write(2) per line).
 */
#ifndef CP_LOG_H
#define CP_LOG_H

enum log_level { LOG_DEBUG, LOG_INFO, LOG_WARN };

void log_set_level(enum log_level lvl);
int log_parse_level(const char *s, enum log_level *out);
int log_enabled(enum log_level lvl);

void log_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warnx(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void fatal(const char *fmt, ...)
    __attribute__((format(printf, 1, 2), noreturn));
void fatalx(const char *fmt, ...)
    __attribute__((format(printf, 1, 2), noreturn));

/* Writes s as a log value into buf: quoted with \" and \\ escaped when it
 * holds spaces, quotes or control bytes.  Returns buf. */
const char *log_quote(const char *s, char *buf, unsigned size);

#endif
