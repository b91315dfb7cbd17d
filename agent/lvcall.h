/*
 * lvcall: one libvirt call with a deadline.  Part of the libvirt driver
 * (vm_libvirt.c).
 *
 * libvirt's client calls block until libvirtd answers, and libvirtd waits
 * for QEMU's monitor without a deadline, so a stopped libvirtd or a hung
 * QEMU would hold the caller -- and with it a prepare, while the other
 * VMs of the group stay paused.  Keepalive (lvconn.c) ends a call on a
 * dead connection after some seconds, but a hung QEMU behind a live
 * libvirtd never ends it.  So each call runs in a thread of its own, and
 * the caller waits for it only until its deadline:
 *
 *   caller: slot free? ──no──► fail at once (an earlier call still hangs)
 *              │ yes: claim the slot, start the worker
 *              ▼
 *           wait ≤ timeout ──answered──► the call's result
 *              │ deadline
 *              ▼
 *           LVCALL_TIMEOUT; the worker is abandoned, not killed
 *
 *   worker: fn(conn, arg) ─► frees what an abandoned caller left (drop),
 *           releases the slot, and records how the call ended in it
 *
 * A slot is one kind of call on one VM (its VM calls, its guest calls):
 * at most one worker per slot is ever running, so a hung QEMU costs one
 * thread per slot, not one per retry.  A slot must outlive its worker
 * (lvcall_slot_busy says whether one runs).
 */
#ifndef CP_LVCALL_H
#define CP_LVCALL_H

#include <pthread.h>
#include <stddef.h>
#include <libvirt/libvirt.h>

enum lvcall_kind {
    LVCALL_OK,
    LVCALL_REFUSED,     /* libvirt answered with an error */
    LVCALL_TRANSPORT,   /* the connection failed under the call: the
                           request may or may not have reached libvirtd */
    LVCALL_TIMEOUT,     /* no answer by the deadline (call abandoned) */
    LVCALL_BUSY,        /* the slot's previous call has not returned */
};

struct lvcall_err {
    enum lvcall_kind kind;
    int code;               /* virErrorNumber, 0 if none */
    unsigned long seq;      /* the call's number in its slot (0: none) */
    char msg[400];          /* "<what>: <libvirt's message or the cause>" */
};

struct lvcall_slot {
    pthread_mutex_t mu;
    int busy;               /* a worker runs */
    char what[48];          /* its call, for the message of a BUSY */
    double since;           /* mono_ms when it started */
    unsigned long seq;      /* calls claimed so far */
    /* How the last abandoned call ended, once it did: late.seq is its
     * number (kind LVCALL_OK: libvirt did it, late); for the driver's
     * settle rules. */
    struct lvcall_err late;
};

void lvcall_slot_init(struct lvcall_slot *s);
/* 1 while a worker of s runs. */
int lvcall_slot_busy(struct lvcall_slot *s);

/*
 * The call: fn runs in the worker on arg, a copy of argsize bytes of the
 * caller's arg that is copied back when the call answers in time.  fn
 * returns 0, -1 (lvcall fills err from libvirt's last error of the worker
 * thread) or LVCALL_SKIPPED.  drop (may be NULL) frees what fn left in an
 * abandoned arg (a string it got, a domain it looked up).  conn (NULL
 * for virConnectOpen) is referenced for the worker's life.
 *
 * Returns 0, or -1 with err (kind, code, "what: message").
 */
typedef int (*lvcall_fn)(virConnectPtr conn, void *arg);

int lvcall_run(struct lvcall_slot *slot, const char *what,
               virConnectPtr conn, lvcall_fn fn, void *arg, size_t argsize,
               void (*drop)(void *arg), int timeout_ms,
               struct lvcall_err *err);

/* In a worker: 1 when its caller gave up waiting.  A worker checks it
 * before a call that changes something (a suspend after its lookup), so
 * that a call nobody waits for any more is not made late; fn then
 * returns LVCALL_SKIPPED (recorded as refused: nothing was done). */
int lvcall_abandoned(void);
#define LVCALL_SKIPPED (-2)

/* virDomainFree for a worker: every public libvirt call resets the
 * thread's last error on entry, virDomainFree too, so the error of the
 * call before it is kept for lvcall first. */
void lvcall_domain_free(virDomainPtr d);

/* Classifies libvirt's last error of this thread into err (for calls
 * made without lvcall_run, in threads of their own). */
void lvcall_last_error(const char *what, struct lvcall_err *err);

#endif
