/*
 * snap: the member-snapshot backends, as one operations table per backend
 * (agent-protocol §6).  A backend creates, confirms, removes and lists the
 * snapshots of a VM's disks; the agent picks the backend and never branches
 * on it.
 *
 *   snap_rbd_ops  "rbd"              librbd on images opened in advance
 *                                    (snap_rbd.c, over rbdsnap.c)
 *   snap_qmp_ops  "qmp-transaction"  QEMU internal snapshots through the
 *                                    VM's monitor (snap_qmp.c)
 *
 * The QMP backend talks to QEMU through struct snap_mon, which the agent
 * fills from its VM driver: storage knows the QMP snapshot commands, the
 * agent knows how to reach the VM.
 *
 * Functions return 0 on success and -1 with struct snap_err filled;
 * remove also returns SNAP_ENOENT for a snapshot that is not there.
 */
#ifndef CP_SNAP_H
#define CP_SNAP_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "rbdsnap.h"

#define SNAP_ENOENT (-2)    /* remove: no such snapshot */

enum snap_errkind {
    SNAP_E_NONE,
    SNAP_E_STORAGE,     /* the storage cluster failed or refused (librbd) */
    SNAP_E_MONITOR,     /* the VM's monitor failed: I/O, protocol */
    SNAP_E_REFUSED,     /* QEMU answered with an error */
    SNAP_E_TIMEOUT,     /* the VM's monitor did not answer in time */
};

struct snap_err {
    enum snap_errkind kind;
    char msg[512];
};

/*
 * The VM's QMP monitor.  call runs one command: args (may be NULL) is
 * stolen; on 0, *ret (if not NULL) gets a new reference to the "return"
 * value; on -1, err says why (kind MONITOR, REFUSED or TIMEOUT).
 */
struct snap_mon {
    int (*call)(void *opaque, const char *cmd, json_t *args, int timeout_ms,
                json_t **ret, struct snap_err *err);
    void *opaque;
};

/* One disk of a VM, as the backends see it (everything borrowed). */
struct snap_disk {
    const char *node;               /* its block node name in QEMU */
    struct rbdsnap_image *img;      /* its RBD image, open; NULL if none */
    const struct snap_mon *mon;     /* the VM's monitor */
};

/* One disk's snapshot in a create: the request, then the result. */
struct snap_member {
    struct snap_disk disk;
    const char *name;               /* borrowed */
    const char *owner;              /* the txn id recorded as its owner */
    int ok;                         /* created (and confirmed, after confirm) */
    int has_id;                     /* rbd, after confirm: id is its snap id,
                                       and the owner key is set */
    int pending;                    /* still running at the deadline: it may
                                       complete later (rbd: then it sets the
                                       owner key itself) */
    uint64_t id;
    double ms;                      /* how long this disk's create took */
    char err[256];                  /* "" unless !ok */
};

/*
 * How long a create can hold the VM paused past its deadline, because
 * nothing can resume the VM while it runs.  That is the case of the QMP
 * method: QEMU runs blockdev-snapshot-internal-sync in its main loop,
 * which also serves `cont`, and on an rbd node it waits there for Ceph
 * with no limit but its own Ceph client's request timeouts.
 */
struct snap_bound {
    int storage;            /* 1: the create waits on Ceph */
    int bound_ms;           /* past the deadline: 0 none, -1 no limit */
    char why[384];          /* where the figure comes from */
};

struct snap_ops {
    const char *name;   /* the method name in replies and config */
    /* 1: every snapshot it makes carries its txn as owner
     * (RBDSNAP_OWNER_PREFIX), one that completes after the deadline too;
     * 0: none does, so abort knows a late one of its txn by name alone. */
    int tags_owner;
    /*
     * Creates m[i].name on each of the n disks (all of one VM) by deadline
     * (mono_ms clock) and fills each member's result.  *timed_out = 1 when
     * the deadline cut it short.  -1 (err set, members left !ok with no
     * err) only when nothing could be started.
     */
    int (*create)(struct snap_member *m, int n, double deadline,
                  int *timed_out, struct snap_err *err);
    /* Called after the VM resumed: checks that each ok member's snapshot
     * really exists, clearing ok with a reason if not, and records its
     * owner (rbd: RBDSNAP_OWNER_PREFIX; outside the pause, as it is one
     * more write per disk).  NULL when a successful create is proof
     * enough. */
    void (*confirm)(struct snap_member *m, int n);
    /* 0 removed, SNAP_ENOENT absent, -1 error. */
    int (*remove)(const struct snap_disk *d, const char *name,
                  int timeout_ms, struct snap_err *err);
    /* *out: a new JSON array of {"name", "id", ...}. */
    int (*list)(const struct snap_disk *d, int timeout_ms, json_t **out,
                struct snap_err *err);
    /* Fills *b for disk d (one monitor call at most, by timeout_ms).
     * NULL: a create never outlives its deadline's hold on the VM (rbd:
     * the agent resumes the VM at the deadline whatever librbd does). */
    int (*pause_bound)(const struct snap_disk *d, int timeout_ms,
                       struct snap_bound *b, struct snap_err *err);
};

extern const struct snap_ops snap_rbd_ops;
extern const struct snap_ops snap_qmp_ops;

/* The backend of a method name ("rbd", "qmp-transaction"), or NULL. */
const struct snap_ops *snap_backend_find(const char *name);

/*
 * The backend that removes and lists the snapshots of one disk: librbd
 * when its RBD image is open, whatever the VM's method (a QMP internal
 * snapshot of an rbd node is an RBD snapshot, so librbd sees it too), else
 * the VM's monitor.
 */
const struct snap_ops *snap_disk_backend(const struct snap_disk *d);

#endif
