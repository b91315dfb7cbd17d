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

/*
 * Runs cmd1, then cmd2, with both requests sent at once: QEMU runs them in
 * order, cmd2 right after cmd1, without waiting for us in between (one
 * round trip instead of two; the redirect cut's stop and switch, agent
 * redirect.c).  args1 and args2 are stolen.  *t1: mono_ms() when cmd1's
 * reply was read.  On -1, *which names the failed call: 1 (cmd2 may have
 * run anyway: QEMU does not know they go together) or 2.  timeout_ms
 * bounds cmd1's reply, and cmd2's from there.
 */
int qmp_call_pair(struct qmp_conn *q, const char *cmd1, json_t *args1,
                  const char *cmd2, json_t *args2, int timeout_ms,
                  double *t1, int *which, struct qmp_err *err);

/* Events seen so far (for tests and stats). */
unsigned long qmp_events_seen(const struct qmp_conn *q);

#endif
