/*
 * lvstart: vm.start of a signed definition on the libvirt connection
 * (vm_ops define_start; the caller verified the signature, defsig.h).
 * Part of the libvirt driver (vm_libvirt.c).
 *
 *   lookup by name ─► running or paused: nothing done (never a second
 *   │                 definition under a running QEMU)
 *   ▼ absent or shut off
 *   virDomainDefineXML (created, or its persistent definition replaced)
 *   ─► virDomainCreate;  transient: virDomainCreateXML, nothing defined
 *   (a drill's copy, gone once it is destroyed: vm.stop)
 *
 * One lvcall worker, with the start's deadline.  The domain need not be a
 * VM of this agent yet (a DR host's agent learns it from libvirt's
 * lifecycle events once it is defined), so the call has a slot of its
 * own, freed when the call answered and kept when it was abandoned (its
 * worker still uses it).
 */
#include "vm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>

#include "lvdomain.h"
#include "mono.h"

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

struct define_call {
    char name[256];
    char *xml;              /* owned by the call (drop frees it) */
    int transient;          /* virDomainCreateXML: no persistent domain */
    int state;              /* virDomainState before, -1 not defined */
};

static void
define_drop(void *p)
{
    free(((struct define_call *)p)->xml);
}

static int
define_run(virConnectPtr conn, void *p)
{
    struct define_call *a = p;
    virDomainPtr d = virDomainLookupByName(conn, a->name);
    int reason, rc;

    a->state = -1;
    if (d) {
        rc = virDomainGetState(d, &a->state, &reason, 0);
        lvcall_domain_free(d);
        if (rc < 0)
            return -1;
        if (a->state == VIR_DOMAIN_RUNNING || a->state == VIR_DOMAIN_PAUSED)
            return 0;
    }
    if (lvcall_abandoned())
        return LVCALL_SKIPPED;  /* the caller reported a timeout already */
    if (a->transient) {
        if (!(d = virDomainCreateXML(conn, a->xml, 0)))
            return -1;
        lvcall_domain_free(d);
        return 0;
    }
    if (!(d = virDomainDefineXML(conn, a->xml)))
        return -1;
    rc = virDomainCreate(d);
    lvcall_domain_free(d);
    return rc;
}

int
lvstart_define_start(void *conn, const char *name, const char *xml,
                     int transient, int timeout_ms, const char **state,
                     double *cmd_ms, struct qmp_err *err)
{
    struct lv_host *h = conn;
    struct lvcall_slot *slot = malloc(sizeof(*slot));
    struct define_call a = {.xml = strdup(xml), .transient = transient};
    struct lvcall_err le = {0};
    virConnectPtr c = h ? lvconn_get(h->c, NULL) : NULL;
    double t0 = mono_ms();
    int rc = -1;

    *cmd_ms = 0;
    *state = "shutoff";
    err->kind = QMP_E_ERROR;
    err->cls[0] = '\0';
    if (!slot || !a.xml || !c) {
        snprintf(err->msg, sizeof(err->msg), "vm %s: %s", name,
                 c ? "out of memory" : "not connected to libvirt "
                 "(reconnecting)");
        free(a.xml);
        free(slot);
        if (c)
            virConnectClose(c);
        return -1;
    }
    snprintf(a.name, sizeof(a.name), "%s", name);
    lvcall_slot_init(slot);
    rc = lvcall_run(slot, transient ? "virDomainCreateXML" :
                    "virDomainDefineXML+virDomainCreate", c,
                    define_run, &a, sizeof(a), define_drop, timeout_ms, &le);
    virConnectClose(c);
    *cmd_ms = mono_ms() - t0;
    if (rc < 0) {
        err->kind = le.kind == LVCALL_TIMEOUT ? QMP_E_TIMEOUT :
                    le.kind == LVCALL_TRANSPORT ? QMP_E_IO : QMP_E_ERROR;
        snprintf(err->msg, sizeof(err->msg), "vm %s: %s", name, le.msg);
    } else if (a.state == VIR_DOMAIN_RUNNING) {
        *state = "running";
    } else if (a.state == VIR_DOMAIN_PAUSED) {
        *state = "paused";
    }
    /* An abandoned call's worker frees its copy of xml and uses slot. */
    if (rc == 0 || le.kind != LVCALL_TIMEOUT)
        free(a.xml);
    if (!lvcall_slot_busy(slot)) {
        pthread_mutex_destroy(&slot->mu);
        free(slot);
    }
    lvcache_refresh(lvconn_cache(h->c), name);
    return rc;
}
