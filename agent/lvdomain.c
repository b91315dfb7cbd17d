/* lvdomain: see lvdomain.h. */
#include "lvdomain.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libvirt/libvirt-qemu.h>
#include <libvirt/virterror.h>

#include "mono.h"

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#define MAX_MOUNTS 16

static const char *const op_name[] = {
    [LVOP_SUSPEND] = "virDomainSuspend", [LVOP_RESUME] = "virDomainResume",
    [LVOP_STATE] = "virDomainGetState", [LVOP_DESTROY] = "virDomainDestroy",
    [LVOP_START] = "virDomainCreate", [LVOP_FREEZE] = "virDomainFSFreeze",
    [LVOP_THAW] = "virDomainFSThaw",
    [LVOP_QMP] = "virDomainQemuMonitorCommand",
    [LVOP_XML] = "virDomainGetXMLDesc",
    [LVOP_AGENT] = "virDomainQemuAgentCommand",
};

static void
call_drop(void *p)
{
    struct lvdomain_call *a = p;

    free(a->in);
    free(a->out);
}

void
lvdomain_call_done(struct lvdomain_call *a, const struct lvcall_err *le,
                   int rc)
{
    /* An abandoned call's worker frees them (call_drop). */
    if (rc == 0 || le->kind != LVCALL_TIMEOUT) {
        free(a->in);
        free(a->out);
    }
    a->in = a->out = NULL;
}

static int
freeze(virDomainPtr d, struct lvdomain_call *a)
{
    const char *mp[MAX_MOUNTS];
    char *save = NULL;
    unsigned n = 0;

    for (char *s = strtok_r(a->mounts, " \t", &save); s && n < MAX_MOUNTS;
         s = strtok_r(NULL, " \t", &save))
        mp[n++] = s;
    return a->ret = virDomainFSFreeze(d, n ? mp : NULL, n, 0);
}

/* The worker: lookup (or define), then the call. */
static int
call_dom(virConnectPtr conn, void *p)
{
    struct lvdomain_call *a = p;
    virDomainPtr d;
    int reason, rc = -1;

    d = a->op == LVOP_START && a->in ? virDomainDefineXML(conn, a->in) :
        virDomainLookupByName(conn, a->name);
    if (!d) {
        a->not_found = virGetLastErrorCode() == VIR_ERR_NO_DOMAIN;
        return -1;
    }
    if ((a->op == LVOP_SUSPEND || a->op == LVOP_FREEZE) &&
        lvcall_abandoned()) {
        /* the lookup came back after the deadline: the caller failed the
         * prepare already, so pausing (or freezing) now helps nobody */
        virDomainFree(d);
        return LVCALL_SKIPPED;
    }
    switch (a->op) {
    case LVOP_SUSPEND:
        rc = virDomainSuspend(d);
        break;
    case LVOP_RESUME:
        /* virDomainResume of a running domain is an error; resuming a
         * running VM is fine in our protocol (agent-protocol §4.6). */
        rc = virDomainGetState(d, &a->state, &reason, 0);
        if (rc == 0 && a->state != VIR_DOMAIN_RUNNING)
            rc = virDomainResume(d);
        break;
    case LVOP_STATE:
        rc = virDomainGetState(d, &a->state, &reason, 0);
        break;
    case LVOP_DESTROY:
        rc = virDomainDestroy(d);
        break;
    case LVOP_START:
        rc = virDomainGetState(d, &a->state, &reason, 0);
        if (rc == 0 && a->state != VIR_DOMAIN_RUNNING &&
            a->state != VIR_DOMAIN_PAUSED)
            rc = virDomainCreate(d);
        break;
    case LVOP_FREEZE:
        rc = freeze(d, a) < 0 ? -1 : 0;
        break;
    case LVOP_THAW:
        rc = (a->ret = virDomainFSThaw(d, NULL, 0, 0)) < 0 ? -1 : 0;
        break;
    case LVOP_QMP:
        rc = virDomainQemuMonitorCommand(d, a->in, &a->out, 0);
        break;
    case LVOP_AGENT:
        /* libvirt syncs with the guest agent itself; it marks the domain
         * tainted (custom-ga-command): vm.guest_* only (§4.12). */
        rc = (a->out = virDomainQemuAgentCommand(d, a->in, a->wait_s, 0)) ?
             0 : -1;
        break;
    case LVOP_XML:
        /* The persistent definition, never VIR_DOMAIN_XML_SECURE: without
         * it libvirt leaves out passwords (graphics, iSCSI), and a cephx
         * key is only ever a secret's UUID in a domain XML. */
        rc = (a->out = virDomainGetXMLDesc(d, VIR_DOMAIN_XML_INACTIVE)) ?
             0 : -1;
        break;
    }
    lvcall_domain_free(d);
    return rc;
}

int
lvdomain_run(struct vm *v, struct lvcall_slot *slot, struct lvdomain_call *a,
             int timeout_ms, struct lvcall_err *le)
{
    struct lv_vm *p = LV_PRIV(v);
    virConnectPtr conn = p && p->h ? lvconn_get(p->h->c, NULL) : NULL;
    int rc;

    snprintf(a->name, sizeof(a->name), "%s", v->cfg->domain);
    if (!conn) {
        le->kind = LVCALL_REFUSED;
        le->code = VIR_ERR_NO_CONNECT;
        snprintf(le->msg, sizeof(le->msg), "%s: vm %s: not connected to "
                 "libvirt (reconnecting)", op_name[a->op], v->cfg->name);
        return -1;
    }
    rc = lvcall_run(slot, op_name[a->op], conn, call_dom, a, sizeof(*a),
                    call_drop, timeout_ms, le);
    virConnectClose(conn);
    return rc;
}

int
lvdomain_run_locked(struct vm *v, struct lvdomain_call *a, int timeout_ms,
                    struct lvcall_err *le, struct qmp_err *err)
{
    double end = mono_ms() + timeout_ms;
    int rc, left;

    if (vm_lock(v, timeout_ms, err, op_name[a->op]) < 0) {
        le->kind = LVCALL_BUSY;
        le->code = 0;
        snprintf(le->msg, sizeof(le->msg), "%s", err->msg);
        return -1;
    }
    left = (int)(end - mono_ms() + 0.5);
    rc = lvdomain_run(v, &LV_PRIV(v)->vm_slot, a, left > 0 ? left : 1, le);
    vm_unlock(v);
    if (rc < 0) {
        err->kind = le->kind == LVCALL_TIMEOUT ? QMP_E_TIMEOUT :
                    le->kind == LVCALL_TRANSPORT ? QMP_E_IO : QMP_E_ERROR;
        err->cls[0] = '\0';
        snprintf(err->msg, sizeof(err->msg), "%s", le->msg);
    }
    return rc;
}

int
lvdomain_cached(const struct vm *v, struct lvdom *d, int *connected)
{
    struct lv_vm *p = LV_PRIV(v);
    struct lvconn_status st;

    *connected = 0;
    if (!p || !p->h)
        return -1;
    lvconn_status(p->h->c, &st);
    *connected = st.connected;
    return lvcache_find(lvconn_cache(p->h->c), v->cfg->domain, d);
}
