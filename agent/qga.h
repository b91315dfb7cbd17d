/*
 * qga: client of the QEMU guest agent (qemu-guest-agent) over the VM's
 * virtio-serial chardev socket, for `quiesce: fs-freeze` (the freeze and
 * thaw rules: docs/agent-protocol.md; the guest side's checks:
 * dr-tests/checkers/quiesce.py).
 *
 * Every call has a deadline (the guest may have no agent, or a hung one).
 * The agent has no request ids, so qga_sync sends guest-sync-delimited with
 * a fresh id: the guest answers 0xFF then {"return": id}, and everything
 * before that (stale replies of earlier timed-out calls) is discarded.
 *
 * Per VM in PREPARE, before QMP stop (a paused guest cannot answer):
 *
 *   connect --> sync (1 s) --> freeze (5 s) --ok--> level fs-freeze
 *                  |               |
 *                  +--timeout/err--+--> level crash, reason kept,
 *                                       thaw queued anyway
 *   ... stop, snapshot, cont ...  --> thaw (after cont; also on ABORT,
 *                                      lease expiry, failed freeze)
 *
 * Functions return 0 or -1 with a message in err.
 */
#ifndef CP_QGA_H
#define CP_QGA_H

#include <stddef.h>
#include <jansson.h>

enum qga_errkind { QGA_E_NONE, QGA_E_IO, QGA_E_TIMEOUT, QGA_E_PROTO,
                   QGA_E_ERROR };

struct qga_conn;

/* Connects to the guest agent socket at path (unix stream). */
int qga_open(const char *path, struct qga_conn **out, char *err,
             size_t errlen);
/* Takes ownership of fd (tests use a socketpair). */
struct qga_conn *qga_open_fd(int fd);
void qga_free(struct qga_conn *q);
/* The kind of the last error. */
enum qga_errkind qga_last_error(const struct qga_conn *q);

/* Any guest agent command (guest-ping, guest-exec, guest-exec-status):
 * args stolen (may be NULL); *ret is the reply's "return" (new
 * reference).  An {"error"} reply fails with QGA_E_ERROR and its desc. */
int qga_call(struct qga_conn *q, const char *cmd, json_t *args,
             int timeout_ms, json_t **ret, char *err, size_t errlen);
int qga_sync(struct qga_conn *q, long id, int timeout_ms, char *err,
             size_t errlen);
/* *nfs: the number of filesystems the guest froze / thawed. */
int qga_freeze(struct qga_conn *q, int timeout_ms, int *nfs, char *err,
               size_t errlen);
int qga_thaw(struct qga_conn *q, int timeout_ms, int *nfs, char *err,
             size_t errlen);

#endif
