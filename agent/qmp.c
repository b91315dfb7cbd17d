/* qmp: see qmp.h. */
#include "qmp.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"
#include "mono.h"

/* QEMU's replies to query-block can be large; lines above this are an error. */
#define QMP_MAX_LINE (8u << 20)

struct qmp_conn {
    char *path;
    int fd;
    long next_id;
    char *buf;
    size_t len, cap;
    qmp_event_cb cb;
    void *opaque;
    unsigned long events;
};

static void
set_err(struct qmp_err *err, enum qmp_errkind kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void
set_err(struct qmp_err *err, enum qmp_errkind kind, const char *fmt, ...)
{
    va_list ap;

    err->kind = kind;
    err->cls[0] = '\0';
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    va_end(ap);
}

struct qmp_conn *
qmp_new(const char *path)
{
    struct qmp_conn *q = calloc(1, sizeof(*q));

    if (!q)
        return NULL;
    q->path = strdup(path ? path : "");
    q->fd = -1;
    q->next_id = 1;
    if (!q->path) {
        free(q);
        return NULL;
    }
    return q;
}

void
qmp_close(struct qmp_conn *q)
{
    if (!q)
        return;
    if (q->fd >= 0)
        close(q->fd);
    q->fd = -1;
    q->len = 0;
}

void
qmp_free(struct qmp_conn *q)
{
    if (!q)
        return;
    qmp_close(q);
    free(q->buf);
    free(q->path);
    free(q);
}

void
qmp_set_event_cb(struct qmp_conn *q, qmp_event_cb cb, void *opaque)
{
    q->cb = cb;
    q->opaque = opaque;
}

int
qmp_connected(const struct qmp_conn *q)
{
    return q->fd >= 0;
}

unsigned long
qmp_events_seen(const struct qmp_conn *q)
{
    return q->events;
}

static int
remaining(double deadline)
{
    double left = deadline - mono_ms();

    return left <= 0 ? 0 : (int)left + 1;
}

/* Reads one line (without "\n") into *line (malloc'd).  0 or -1. */
static int
read_line(struct qmp_conn *q, double deadline, char **line,
          struct qmp_err *err, const char *what)
{
    for (;;) {
        char *nl = q->len ? memchr(q->buf, '\n', q->len) : NULL;
        struct pollfd pfd = {.fd = q->fd, .events = POLLIN};
        ssize_t n;
        int r;

        if (nl) {
            size_t l = (size_t)(nl - q->buf);
            *line = malloc(l + 1);
            if (!*line) {
                set_err(err, QMP_E_IO, "%s: out of memory", what);
                return -1;
            }
            memcpy(*line, q->buf, l);
            (*line)[l] = '\0';
            if (l && (*line)[l - 1] == '\r')
                (*line)[l - 1] = '\0';
            memmove(q->buf, nl + 1, q->len - l - 1);
            q->len -= l + 1;
            return 0;
        }
        if (q->len >= QMP_MAX_LINE) {
            set_err(err, QMP_E_PROTO, "%s: reply line longer than %u bytes",
                    what, QMP_MAX_LINE);
            return -1;
        }
        if (q->cap - q->len < 4096) {
            size_t ncap = q->cap ? q->cap * 2 : 16384;
            char *nb = realloc(q->buf, ncap);
            if (!nb) {
                set_err(err, QMP_E_IO, "%s: out of memory", what);
                return -1;
            }
            q->buf = nb;
            q->cap = ncap;
        }
        r = poll(&pfd, 1, remaining(deadline));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            set_err(err, QMP_E_IO, "%s: poll: %s", what, strerror(errno));
            return -1;
        }
        if (r == 0 || mono_ms() >= deadline) {
            set_err(err, QMP_E_TIMEOUT, "%s: no reply from QEMU within the "
                    "deadline", what);
            return -1;
        }
        n = read(q->fd, q->buf + q->len, q->cap - q->len);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n <= 0) {
            set_err(err, QMP_E_IO, "%s: QEMU closed the monitor%s%s", what,
                    n < 0 ? ": " : "", n < 0 ? strerror(errno) : "");
            return -1;
        }
        q->len += (size_t)n;
    }
}

static int
write_all(struct qmp_conn *q, const char *s, size_t len, double deadline,
          struct qmp_err *err, const char *what)
{
    size_t off = 0;

    while (off < len) {
        struct pollfd pfd = {.fd = q->fd, .events = POLLOUT};
        ssize_t n;
        int r = poll(&pfd, 1, remaining(deadline));

        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            set_err(err, r == 0 ? QMP_E_TIMEOUT : QMP_E_IO,
                    "%s: cannot send to QEMU%s", what,
                    r == 0 ? " within the deadline" : "");
            return -1;
        }
        n = send(q->fd, s + off, len - off, MSG_NOSIGNAL);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n < 0) {
            set_err(err, QMP_E_IO, "%s: send: %s", what, strerror(errno));
            return -1;
        }
        off += (size_t)n;
    }
    return 0;
}

/* Reads messages until one that is not an event; returns it. */
static int
read_message(struct qmp_conn *q, double deadline, json_t **out,
             struct qmp_err *err, const char *what)
{
    for (;;) {
        char *line = NULL;
        json_error_t je;
        json_t *m, *ev;

        if (read_line(q, deadline, &line, err, what) < 0)
            return -1;
        if (line[0] == '\0') {
            free(line);
            continue;
        }
        log_debug("event=qmp_recv sock=%s json=%s", q->path, line);
        m = json_loads(line, 0, &je);
        free(line);
        if (!json_is_object(m)) {
            json_decref(m);
            set_err(err, QMP_E_PROTO, "%s: QEMU sent a non-object line", what);
            return -1;
        }
        ev = json_object_get(m, "event");
        if (json_is_string(ev)) {
            /* Async events interleave freely with replies (QMP spec 2.5). */
            q->events++;
            if (q->cb)
                q->cb(json_string_value(ev), m, q->opaque);
            json_decref(m);
            continue;
        }
        *out = m;
        return 0;
    }
}

static int
negotiate(struct qmp_conn *q, double deadline, struct qmp_err *err)
{
    json_t *m = NULL;
    int ret = -1;

    if (read_message(q, deadline, &m, err, "greeting") < 0)
        goto cleanup;
    if (!json_is_object(json_object_get(m, "QMP"))) {
        set_err(err, QMP_E_PROTO, "greeting: not a QMP greeting");
        goto cleanup;
    }
    ret = 0;
cleanup:
    json_decref(m);
    return ret;
}

/* Builds and sends one request; *myid its id. */
static int
send_req(struct qmp_conn *q, const char *cmd, json_t *args, double deadline,
         long *myid, struct qmp_err *err)
{
    json_t *req = NULL;
    char *s = NULL;
    int rc = -1;

    *myid = q->next_id++;
    /* build */
    req = json_pack("{s:s,s:I}", "execute", cmd, "id", (json_int_t)*myid);
    if (!req || (args && json_object_set(req, "arguments", args) < 0)) {
        set_err(err, QMP_E_IO, "%s: cannot build request", cmd);
        goto cleanup;
    }
    s = json_dumps(req, JSON_COMPACT);
    if (!s) {
        set_err(err, QMP_E_IO, "%s: cannot encode request", cmd);
        goto cleanup;
    }
    log_debug("event=qmp_send sock=%s json=%s", q->path, s);
    /* send */
    if (write_all(q, s, strlen(s), deadline, err, cmd) < 0 ||
        write_all(q, "\n", 1, deadline, err, cmd) < 0)
        goto cleanup;
    rc = 0;
cleanup:
    free(s);
    json_decref(req);
    return rc;
}

/* Reads until the reply to myid; checks its error; parses. */
static int
wait_reply(struct qmp_conn *q, const char *cmd, long myid, double deadline,
           json_t **ret, struct qmp_err *err)
{
    json_t *m = NULL, *e, *id;
    int rc = -1;

    for (;;) {
        if (read_message(q, deadline, &m, err, cmd) < 0)
            goto cleanup;
        id = json_object_get(m, "id");
        if (json_is_integer(id) && json_integer_value(id) == myid)
            break;
        /* A reply to an earlier call that timed out: not ours. */
        log_debug("event=qmp_stale_reply sock=%s", q->path);
        json_decref(m);
        m = NULL;
    }
    /* check error */
    e = json_object_get(m, "error");
    if (e) {
        const char *desc = json_string_value(json_object_get(e, "desc"));
        const char *cls = json_string_value(json_object_get(e, "class"));
        set_err(err, QMP_E_ERROR, "%s: %s", cmd, desc ? desc : "error");
        snprintf(err->cls, sizeof(err->cls), "%s", cls ? cls : "");
        rc = -1;
        goto cleanup;
    }
    /* parse */
    if (!json_object_get(m, "return")) {
        set_err(err, QMP_E_PROTO, "%s: reply has neither return nor error",
                cmd);
        goto cleanup;
    }
    if (ret)
        *ret = json_incref(json_object_get(m, "return"));
    rc = 0;
cleanup:
    json_decref(m);
    return rc;
}

static int
do_call(struct qmp_conn *q, const char *cmd, json_t *args, double deadline,
        json_t **ret, struct qmp_err *err)
{
    long myid;

    if (send_req(q, cmd, args, deadline, &myid, err) < 0)
        return -1;
    return wait_reply(q, cmd, myid, deadline, ret, err);
}

int
qmp_open_fd(struct qmp_conn *q, int fd, int timeout_ms, struct qmp_err *err)
{
    double deadline = mono_ms() + timeout_ms;

    qmp_close(q);
    q->fd = fd;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    if (negotiate(q, deadline, err) < 0 ||
        do_call(q, "qmp_capabilities", NULL, deadline, NULL, err) < 0) {
        qmp_close(q);
        return -1;
    }
    return 0;
}

int
qmp_open(struct qmp_conn *q, int timeout_ms, struct qmp_err *err)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int fd;

    if (q->fd >= 0)
        return 0;
    if (strlen(q->path) >= sizeof(sa.sun_path)) {
        set_err(err, QMP_E_IO, "connect: socket path too long: %s", q->path);
        return -1;
    }
    strcpy(sa.sun_path, q->path);
    /* Non-blocking connect: a stopped QEMU does not accept(), and once its
     * listen backlog is full a blocking connect(2) would wait forever. */
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        set_err(err, QMP_E_IO, "connect: socket: %s", strerror(errno));
        return -1;
    }
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        if (errno == EAGAIN)
            set_err(err, QMP_E_TIMEOUT, "connect %s: QEMU is not accepting "
                    "monitor connections (hung?)", q->path);
        else
            set_err(err, QMP_E_IO, "connect %s: %s", q->path,
                    strerror(errno));
        close(fd);
        return -1;
    }
    return qmp_open_fd(q, fd, timeout_ms, err);
}

int
qmp_call(struct qmp_conn *q, const char *cmd, json_t *args, int timeout_ms,
         json_t **ret, struct qmp_err *err)
{
    double deadline = mono_ms() + timeout_ms;
    int rc = -1;

    err->kind = QMP_E_NONE;
    if (q->fd < 0 && qmp_open(q, timeout_ms, err) < 0) {
        char inner[sizeof(err->msg)];
        memcpy(inner, err->msg, sizeof(inner));
        snprintf(err->msg, sizeof(err->msg), "%s: %.400s", cmd, inner);
        goto cleanup;
    }
    rc = do_call(q, cmd, args, deadline, ret, err);
    /* After a timeout or a broken stream the connection state is unknown. */
    if (rc < 0 && err->kind != QMP_E_ERROR)
        qmp_close(q);
cleanup:
    json_decref(args);
    return rc;
}

int
qmp_call_pair(struct qmp_conn *q, const char *cmd1, json_t *args1,
              const char *cmd2, json_t *args2, int timeout_ms,
              double *t1, int *which, struct qmp_err *err)
{
    double deadline = mono_ms() + timeout_ms;
    long id1, id2;
    int rc = -1;

    err->kind = QMP_E_NONE;
    *which = 1;
    if (q->fd < 0 && qmp_open(q, timeout_ms, err) < 0) {
        char inner[sizeof(err->msg)];
        memcpy(inner, err->msg, sizeof(inner));
        snprintf(err->msg, sizeof(err->msg), "%s: %.400s", cmd1, inner);
        goto cleanup;
    }
    if (send_req(q, cmd1, args1, deadline, &id1, err) < 0)
        goto broken;
    if (send_req(q, cmd2, args2, deadline, &id2, err) < 0) {
        /* cmd1 went alone: its reply is not read; the stream is reset */
        goto broken;
    }
    rc = wait_reply(q, cmd1, id1, deadline, NULL, err);
    *t1 = mono_ms();
    if (rc < 0) {
        if (err->kind != QMP_E_ERROR)
            goto broken;
        /* cmd2's reply is still due: read it so the stream stays in step
         * (QEMU ran cmd2 anyway); cmd1's error is what is reported */
        struct qmp_err e2;
        if (wait_reply(q, cmd2, id2, *t1 + timeout_ms, NULL, &e2) < 0 &&
            e2.kind != QMP_E_ERROR)
            qmp_close(q);
        goto cleanup;
    }
    *which = 2;
    /* cmd2 ran right after cmd1 in QEMU: its own deadline from here */
    rc = wait_reply(q, cmd2, id2, *t1 + timeout_ms, NULL, err);
    if (rc < 0 && err->kind != QMP_E_ERROR)
        goto broken;
    goto cleanup;
broken:
    /* After a timeout or a broken stream the connection state is unknown. */
    rc = -1;
    qmp_close(q);
cleanup:
    json_decref(args1);
    json_decref(args2);
    return rc;
}
