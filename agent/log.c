/* log: see log.h. */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static enum log_level min_level = LOG_INFO;
static const char *names[] = {"debug", "info", "warn"};

void
log_set_level(enum log_level lvl)
{
    min_level = lvl;
}

int
log_enabled(enum log_level lvl)
{
    return lvl >= min_level;
}

int
log_parse_level(const char *s, enum log_level *out)
{
    for (int i = 0; i < 3; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = (enum log_level)i;
            return 0;
        }
    return -1;
}

static void
vlog(enum log_level lvl, const char *level, const char *fmt, va_list ap,
     int with_errno, int saved_errno)
{
    char line[4096];
    struct timespec ts;
    struct tm tm;
    int n, m;

    if (lvl < min_level)
        return;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    n = snprintf(line, sizeof(line), "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ "
                 "level=%s ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                 tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, level);
    m = vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    n = (m < 0 || (size_t)(n + m) >= sizeof(line) - 64) ?
        (int)sizeof(line) - 64 : n + m;
    if (with_errno)
        n += snprintf(line + n, sizeof(line) - (size_t)n, " err=\"%s\"",
                      strerror(saved_errno));
    line[n++] = '\n';
    /* one write per line keeps concurrent threads' lines whole */
    if (write(STDERR_FILENO, line, (size_t)n) < 0)
        return;
}

#define DEFINE_LOG(fn, lvl, label, errflag)        \
    void fn(const char *fmt, ...)                  \
    {                                              \
        int e = errno;                             \
        va_list ap;                                \
        va_start(ap, fmt);                         \
        vlog(lvl, label, fmt, ap, errflag, e);     \
        va_end(ap);                                \
        errno = e;                                 \
    }

DEFINE_LOG(log_debug, LOG_DEBUG, "debug", 0)
DEFINE_LOG(log_info, LOG_INFO, "info", 0)
DEFINE_LOG(log_warn, LOG_WARN, "warn", 1)
DEFINE_LOG(log_warnx, LOG_WARN, "warn", 0)

void
fatal(const char *fmt, ...)
{
    int e = errno;
    va_list ap;

    va_start(ap, fmt);
    vlog(LOG_WARN, "fatal", fmt, ap, 1, e);
    va_end(ap);
    exit(1);
}

void
fatalx(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vlog(LOG_WARN, "fatal", fmt, ap, 0, 0);
    va_end(ap);
    exit(1);
}

const char *
log_quote(const char *s, char *buf, unsigned size)
{
    unsigned o = 0;
    int need = 0;

    if (!s)
        s = "";
    if (size < 4) {
        buf[0] = '\0';
        return buf;
    }
    for (const char *p = s; *p; p++)
        if (*p == ' ' || *p == '"' || *p == '\\' || *p == '=' ||
            (unsigned char)*p < 0x20)
            need = 1;
    if (!need && *s) {
        snprintf(buf, size, "%s", s);
        return buf;
    }
    buf[o++] = '"';
    for (const char *p = s; *p && o + 3 < size; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '"' || c == '\\')
            buf[o++] = '\\';
        buf[o++] = c < 0x20 ? ' ' : (char)c;
    }
    buf[o++] = '"';
    buf[o] = '\0';
    return buf;
}
