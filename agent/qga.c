/* qga: QEMU guest agent client with a deadline on every call (qga.h). */
#include "qga.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <jansson.h>

#include "mono.h"

/* One reply line.  guest-exec-status carries the command's whole output
 * base64-encoded in one line (qemu-ga keeps up to 16 MiB of it), so a
 * line longer than this fails the call ("reply line too long") rather
 * than growing the buffer without bound; freeze and thaw replies are a
 * few bytes. */
#define QGA_MAX_LINE (2u << 20)

struct qga_conn {
    int fd;
    enum qga_errkind kind;
    char *buf;              /* QGA_MAX_LINE bytes */
    size_t len;
};

static int
fail(struct qga_conn *q, enum qga_errkind kind, char *err, size_t errlen,
     const char *fmt, const char *what, const char *detail)
{
    q->kind = kind;
    snprintf(err, errlen, fmt, what, detail);
    return -1;
}

struct qga_conn *
qga_open_fd(int fd)
{
    struct qga_conn *q = calloc(1, sizeof(*q));

    if (!q || !(q->buf = malloc(QGA_MAX_LINE))) {
        free(q);
        close(fd);
        return NULL;
    }
    q->fd = fd;
    return q;
}

int
qga_open(const char *path, struct qga_conn **out, char *err, size_t errlen)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int fd;

    *out = NULL;
    if (strlen(path) >= sizeof(sa.sun_path)) {
        snprintf(err, errlen, "guest agent socket path too long: %s", path);
        return -1;
    }
    strcpy(sa.sun_path, path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        snprintf(err, errlen, "guest agent %s: connect: %s", path,
                 strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if (!(*out = qga_open_fd(fd))) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

void
qga_free(struct qga_conn *q)
{
    if (!q)
        return;
    close(q->fd);
    free(q->buf);
    free(q);
}

enum qga_errkind
qga_last_error(const struct qga_conn *q)
{
    return q ? q->kind : QGA_E_NONE;
}

static int
wait_fd(struct qga_conn *q, short ev, double deadline)
{
    struct pollfd p = {.fd = q->fd, .events = ev};
    double left = deadline - mono_ms();
    int r;

    if (left <= 0)
        return 0;
    do
        r = poll(&p, 1, (int)left + 1);
    while (r < 0 && errno == EINTR);
    return r;
}

static int
send_cmd(struct qga_conn *q, const char *cmd, json_t *args, double deadline,
         char *err, size_t errlen)
{
    json_t *req = json_pack("{s:s}", "execute", cmd);
    char *s;
    size_t off = 0, n;
    int rc = -1;

    if (args)
        json_object_set_new(req, "arguments", args);
    s = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    if (!s)
        return fail(q, QGA_E_IO, err, errlen, "%s: %s", cmd, "cannot encode");
    n = strlen(s);
    s[n++] = '\n';      /* json_dumps leaves room: replace the NUL */
    while (off < n) {
        ssize_t k = send(q->fd, s + off, n - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            off += (size_t)k;
            continue;
        }
        if (k < 0 && (errno == EAGAIN || errno == EINTR)) {
            if (wait_fd(q, POLLOUT, deadline) <= 0) {
                fail(q, QGA_E_TIMEOUT, err, errlen, "%s: %s", cmd,
                     "send timed out");
                goto cleanup;
            }
            continue;
        }
        fail(q, QGA_E_IO, err, errlen, "%s: send: %s", cmd, strerror(errno));
        goto cleanup;
    }
    rc = 0;
cleanup:
    free(s);
    return rc;
}

/* Reads into the buffer until byte c is in it; returns its index or -1. */
static long
read_until(struct qga_conn *q, char c, const char *cmd, double deadline,
           char *err, size_t errlen)
{
    for (;;) {
        char *p = memchr(q->buf, c, q->len);
        ssize_t k;

        if (p)
            return p - q->buf;
        if (q->len == QGA_MAX_LINE)
            return fail(q, QGA_E_PROTO, err, errlen, "%s: %s", cmd,
                        "reply line too long");
        if (wait_fd(q, POLLIN, deadline) <= 0)
            return fail(q, QGA_E_TIMEOUT, err, errlen, "%s: %s", cmd,
                        "guest agent did not answer before the deadline");
        k = recv(q->fd, q->buf + q->len, QGA_MAX_LINE - q->len,
                 MSG_DONTWAIT);
        if (k == 0)
            return fail(q, QGA_E_IO, err, errlen, "%s: %s", cmd,
                        "guest agent closed the connection");
        if (k < 0 && errno != EAGAIN && errno != EINTR)
            return fail(q, QGA_E_IO, err, errlen, "%s: recv: %s", cmd,
                        strerror(errno));
        if (k > 0)
            q->len += (size_t)k;
    }
}

static void
consume(struct qga_conn *q, size_t n)
{
    memmove(q->buf, q->buf + n, q->len - n);
    q->len -= n;
}

/* Reads the next non-empty JSON line. */
static json_t *
read_reply(struct qga_conn *q, const char *cmd, double deadline, char *err,
           size_t errlen)
{
    for (;;) {
        long i = read_until(q, '\n', cmd, deadline, err, errlen);
        json_t *m;

        if (i < 0)
            return NULL;
        q->buf[i] = '\0';
        m = json_loads(q->buf, 0, NULL);
        consume(q, (size_t)i + 1);
        if (json_is_object(m))
            return m;
        json_decref(m);     /* blank or garbled line: not a reply */
    }
}

int
qga_sync(struct qga_conn *q, long id, int timeout_ms, char *err,
         size_t errlen)
{
    double deadline = mono_ms() + timeout_ms;
    const char *cmd = "guest-sync-delimited";

    q->kind = QGA_E_NONE;
    if (send_cmd(q, cmd, json_pack("{s:I}", "id", (json_int_t)id), deadline,
                 err, errlen) < 0)
        return -1;
    for (;;) {
        long i = read_until(q, (char)0xff, cmd, deadline, err, errlen);
        json_t *m, *r;
        int match;

        if (i < 0)
            return -1;
        consume(q, (size_t)i + 1);      /* everything up to the delimiter */
        if (!(m = read_reply(q, cmd, deadline, err, errlen)))
            return -1;
        r = json_object_get(m, "return");
        match = json_is_integer(r) && json_integer_value(r) == id;
        json_decref(m);
        if (match)
            return 0;
        /* the answer to an earlier sync that timed out: keep reading */
    }
}

int
qga_call(struct qga_conn *q, const char *cmd, json_t *args, int timeout_ms,
         json_t **ret, char *err, size_t errlen)
{
    double deadline = mono_ms() + timeout_ms;
    json_t *m, *e;

    *ret = NULL;
    q->kind = QGA_E_NONE;
    if (send_cmd(q, cmd, args, deadline, err, errlen) < 0)
        return -1;
    if (!(m = read_reply(q, cmd, deadline, err, errlen)))
        return -1;
    if ((e = json_object_get(m, "error"))) {
        const char *d = json_string_value(json_object_get(e, "desc"));
        fail(q, QGA_E_ERROR, err, errlen, "%s: %s", cmd, d ? d : "error");
        json_decref(m);
        return -1;
    }
    if (!(*ret = json_incref(json_object_get(m, "return")))) {
        fail(q, QGA_E_PROTO, err, errlen, "%s: %s", cmd,
             "reply has neither return nor error");
        json_decref(m);
        return -1;
    }
    json_decref(m);
    return 0;
}

static int
simple_cmd(struct qga_conn *q, const char *cmd, int timeout_ms, int *nfs,
           char *err, size_t errlen)
{
    json_t *r;

    if (qga_call(q, cmd, NULL, timeout_ms, &r, err, errlen) < 0)
        return -1;
    if (!json_is_integer(r)) {
        fail(q, QGA_E_PROTO, err, errlen, "%s: %s", cmd,
             "reply has no integer return");
        json_decref(r);
        return -1;
    }
    if (nfs)
        *nfs = (int)json_integer_value(r);
    json_decref(r);
    return 0;
}

int
qga_freeze(struct qga_conn *q, int timeout_ms, int *nfs, char *err,
           size_t errlen)
{
    return simple_cmd(q, "guest-fsfreeze-freeze", timeout_ms, nfs, err,
                      errlen);
}

int
qga_thaw(struct qga_conn *q, int timeout_ms, int *nfs, char *err,
         size_t errlen)
{
    return simple_cmd(q, "guest-fsfreeze-thaw", timeout_ms, nfs, err, errlen);
}
