/*
 * lvdomain: one libvirt call on one VM's domain, with a deadline, and the
 * libvirt driver's state that those calls share.  Part of the libvirt
 * driver (vm_libvirt.c, guest_libvirt.c).
 *
 *   lvdomain_run         lookup of the domain by name, then the call, in
 *                        one lvcall worker (deadline), in one of the VM's
 *                        slots: its VM calls, or its guest agent calls
 *                        (libvirt runs a guest agent command beside a
 *                        suspend, so a hung guest agent never blocks the
 *                        cut)
 *   lvdomain_run_locked  the same under the VM's mutex (vm_lock), with
 *                        one deadline for both, and the result in the
 *                        agent's terms (struct qmp_err)
 *   lvdomain_cached      the domain as the connection's cache last saw it
 *                        (no I/O)
 */
#ifndef CP_LVDOMAIN_H
#define CP_LVDOMAIN_H

#include <pthread.h>

#include "lvcall.h"
#include "lvconn.h"
#include "vm.h"

/* The driver's connection (its vm_host slot). */
struct lv_host {
    struct lvconn *c;
    int passthrough;                /* [libvirt] qmp_passthrough */
    const struct agent_config *cfg; /* the agent's, for manage */
};

/* The driver's per-VM state (v->priv). */
struct lv_vm {
    struct lv_host *h;              /* borrowed; NULL until bringup */
    struct lvcall_slot vm_slot, guest_slot;
    pthread_mutex_t mu;             /* guards the fields below */
    int unsettled;                  /* a suspend may still land */
    long unsettled_epoch;           /* the connection it was sent on */
    unsigned long unsettled_seq;    /* its call in vm_slot */
    char node[CFG_MAX_DISKS][64];   /* passthrough: QEMU node names */
};

#define LV_PRIV(v) ((struct lv_vm *)(v)->priv)

enum lvdomain_op {
    LVOP_SUSPEND, LVOP_RESUME, LVOP_STATE, LVOP_DESTROY, LVOP_START,
    LVOP_FREEZE, LVOP_THAW, LVOP_QMP, LVOP_XML, LVOP_AGENT,
};

/* One call: its inputs, then its results.  in and out are owned by the
 * call (an abandoned worker frees them). */
struct lvdomain_call {
    enum lvdomain_op op;
    char name[256];         /* the domain (set by lvdomain_run) */
    char mounts[1024];      /* FREEZE: blank-separated, "" all */
    char *in;               /* START: XML to define first; QMP, AGENT:
                               the command's JSON */
    int wait_s;             /* AGENT: libvirt's own guest agent timeout */
    int not_found;          /* no such domain */
    int state, ret;         /* virDomainState; FREEZE/THAW's count */
    char *out;              /* QMP, AGENT: the reply; XML: the persistent
                               definition (VIR_DOMAIN_XML_INACTIVE) */
};

/* Runs a on v's domain within timeout_ms, in slot.  0, or -1 with le.
 * Not connected: -1, kind LVCALL_REFUSED, code VIR_ERR_NO_CONNECT
 * (nothing was sent). */
int lvdomain_run(struct vm *v, struct lvcall_slot *slot,
                 struct lvdomain_call *a, int timeout_ms,
                 struct lvcall_err *le);
/* lvdomain_run in the VM slot under vm_lock; on -1 err is the agent's
 * view: QMP_E_ERROR (libvirt did not do it: refused, or not sent),
 * QMP_E_TIMEOUT (no answer in time) or QMP_E_IO (connection lost under
 * it): with the last two it may still happen. */
int lvdomain_run_locked(struct vm *v, struct lvdomain_call *a,
                        int timeout_ms, struct lvcall_err *le,
                        struct qmp_err *err);
/* Frees in and out of a call that answered (the caller's copy). */
void lvdomain_call_done(struct lvdomain_call *a, const struct lvcall_err *le,
                        int rc);

/* v's domain as the cache last saw it: 0 and *d, or -1 when the cache has
 * none or the VM has no connection yet.  *connected: the cache is fresh. */
int lvdomain_cached(const struct vm *v, struct lvdom *d, int *connected);

/* vm_ops define_start of the libvirt driver (lvstart.c). */
int lvstart_define_start(void *conn, const char *name, const char *xml,
                         int transient, int timeout_ms, const char **state,
                         double *cmd_ms, struct qmp_err *err);

#endif
