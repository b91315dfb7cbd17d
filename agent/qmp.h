/*
 * qmp: a QEMU Machine Protocol client over a UNIX socket.
 *
 *   qmp_open(): connect → read greeting {"QMP":...} → qmp_capabilities
 *   qmp_call(): build → send (deadline) → read lines until the reply with
 *               our id; events ({"event":...}) that arrive in between are
 *               handed to the event callback, stale replies (ids of calls
 *               that timed out earlier) are dropped → check "error" → return
 *               the "return" value.
 *
 * Every call takes a deadline in milliseconds and waits with poll(2) only.
 * After a timeout or an I/O error the connection is closed (the stream may
 * hold a half-read reply); the next call reconnects.  One qmp_conn is used
 * by one thread at a time (the caller serializes, per VM).
 */
#ifndef CP_QMP_H
#define CP_QMP_H

#include <stddef.h>
#include <jansson.h>

enum qmp_errkind {
    QMP_E_NONE,
    QMP_E_IO,        /* connect/read/write failed, or QEMU closed */
    QMP_E_TIMEOUT,   /* the deadline passed */
    QMP_E_PROTO,     /* QEMU sent something that is not QMP */
    QMP_E_ERROR,     /* QEMU replied {"error": {class, desc}} */
};

struct qmp_err {
    enum qmp_errkind kind;
    char cls[64];         /* QEMU's error class, for QMP_E_ERROR */
    char msg[512];        /* "<command>: <desc or cause>" */
};

struct qmp_conn;

typedef void (*qmp_event_cb)(const char *event, json_t *msg, void *opaque);

/* Creates an unconnected client for the socket at path (copied). */
struct qmp_conn *qmp_new(const char *path);
void qmp_free(struct qmp_conn *q);
void qmp_set_event_cb(struct qmp_conn *q, qmp_event_cb cb, void *opaque);

/* Connects and negotiates unless already connected. */
int qmp_open(struct qmp_conn *q, int timeout_ms, struct qmp_err *err);
/* Negotiates over an already connected fd (taken over); for tests. */
int qmp_open_fd(struct qmp_conn *q, int fd, int timeout_ms,
                struct qmp_err *err);
void qmp_close(struct qmp_conn *q);
int qmp_connected(const struct qmp_conn *q);

/*
 * Runs one command.  args (may be NULL) is stolen.  On 0, *ret (if not
 * NULL) receives a new reference to the "return" value.  Connects first
 * if needed, within the same deadline.
 */
int qmp_call(struct qmp_conn *q, const char *cmd, json_t *args,
             int timeout_ms, json_t **ret, struct qmp_err *err);

/* Events seen so far (for tests and stats). */
unsigned long qmp_events_seen(const struct qmp_conn *q);

#endif
