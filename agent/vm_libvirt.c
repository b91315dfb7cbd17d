/*
 * vm_libvirt: the "libvirt" VM driver (vm.h), for libvirt-managed domains.
 * The only file of the agent that calls libvirt.
 *
 *   connection  virConnectOpen of [libvirt] uri; with discover = yes every
 *               running domain the config does not name becomes a VM, with
 *               its disks from QMP query-block
 *   pause/resume/state/poweroff
 *               virDomainSuspend / virDomainResume / virDomainGetState /
 *               virDomainDestroy
 *   qmp         raw QMP through virDomainQemuMonitorCommand (the
 *               qmp-transaction snapshot backend)
 *   guest       the agent's own qga socket (guest_qga.c)
 *
 * A VM's per-VM state is the shared connection (borrowed); each call
 * looks its domain up by name.
 */
#include "vm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libvirt/libvirt.h>
#include <libvirt/libvirt-qemu.h>
#include <libvirt/virterror.h>

#include "guest_qga.h"
#include "log.h"

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#define SET(dst, v) snprintf((dst), sizeof(dst), "%s", (v))

static void
lv_err(struct qmp_err *err, const char *what)
{
    const char *m = virGetLastErrorMessage();

    err->kind = QMP_E_ERROR;
    err->cls[0] = '\0';
    snprintf(err->msg, sizeof(err->msg), "%s: %s", what, m ? m : "error");
}

static int
lv_config_check(const struct agent_config *cfg, struct cfg_vm *m,
                const char *path, char *err, size_t errlen)
{
    if (m->start[0]) {
        snprintf(err, errlen, "%s: [vm %s] start = is for the qmp driver "
                 "(libvirt: vm.start with spec.xml)", path, m->name);
        return -1;
    }
    if (!cfg->libvirt_uri[0]) {
        snprintf(err, errlen, "%s: [vm %s] uses libvirt but [libvirt] uri is "
                 "not set", path, m->name);
        return -1;
    }
    if (!m->domain[0])
        SET(m->domain, m->name);
    return 0;
}

/* libvirt prints every error to stderr by default; ours go through log.c. */
static void
quiet_libvirt(void *opaque, virErrorPtr e)
{
    (void)opaque;
    (void)e;
}

static int
lv_conn_open(const struct agent_config *cfg, void **conn, char *err,
             size_t errlen)
{
    virConnectPtr c;

    /* Before the first libvirt call of the process (none runs without a
     * connection). */
    virSetErrorFunc(NULL, quiet_libvirt);
    if (!cfg->libvirt_uri[0])
        return 0;
    if (!(c = virConnectOpen(cfg->libvirt_uri))) {
        const char *m = virGetLastErrorMessage();
        snprintf(err, errlen, "libvirt %s: %s", cfg->libvirt_uri,
                 m ? m : "cannot connect");
        return -1;
    }
    *conn = c;
    return 0;
}

static void
lv_conn_close(void *conn)
{
    virConnectClose(conn);
}

/*
 * Fills one disk from a QMP query-block entry: the format node name, and
 * the backend from the image file name ("rbd:pool/image...", a
 * "json:{...rbd...}" name, or a plain qcow2 path).  0, or -1 to skip it.
 */
static int
disk_from_block(json_t *blk, struct cfg_disk *d)
{
    json_t *ins = json_object_get(blk, "inserted"), *j = NULL, *f;
    const char *node = json_string_value(json_object_get(ins, "node-name"));
    const char *drv = json_string_value(json_object_get(ins, "drv"));
    const char *fn = json_string_value(json_object_get(
        json_object_get(ins, "image"), "filename"));
    const char *pool = NULL, *image = NULL;
    int rc = -1;

    if (!node || !fn || strlen(node) >= sizeof(d->node))
        return -1;
    memset(d, 0, sizeof(*d));
    snprintf(d->node, sizeof(d->node), "%s", node);
    if (strncmp(fn, "json:", 5) == 0 && (j = json_loads(fn + 5, 0, NULL))) {
        for (f = j; f && !pool; f = json_object_get(f, "file"))
            if (json_is_string(json_object_get(f, "pool")) &&
                json_is_string(json_object_get(f, "image"))) {
                pool = json_string_value(json_object_get(f, "pool"));
                image = json_string_value(json_object_get(f, "image"));
            }
        if (pool) {
            d->backend = CFG_BACKEND_RBD;
            snprintf(d->pool, sizeof(d->pool), "%s", pool);
            snprintf(d->image, sizeof(d->image), "%s", image);
            rc = 0;
        }
    } else if (strncmp(fn, "rbd:", 4) == 0) {
        const char *slash = strchr(fn + 4, '/');
        if (slash && (size_t)(slash - fn - 4) < sizeof(d->pool)) {
            d->backend = CFG_BACKEND_RBD;
            memcpy(d->pool, fn + 4, (size_t)(slash - fn - 4));
            snprintf(d->image, sizeof(d->image), "%.*s",
                     (int)strcspn(slash + 1, ":@"), slash + 1);
            rc = 0;
        }
    } else if (drv && strcmp(drv, "qcow2") == 0 && fn[0] == '/') {
        d->backend = CFG_BACKEND_QCOW2;
        snprintf(d->file, sizeof(d->file), "%s", fn);
        rc = 0;
    }
    json_decref(j);
    return rc;
}

/* [libvirt] discover = yes: every running domain not named in the config
 * becomes a VM of this driver, with disks from QMP query-block. */
static void
lv_discover(void *conn, struct agent_config *cfg)
{
    virDomainPtr *doms = NULL;
    int n;

    if (!cfg->libvirt_discover)
        return;
    n = virConnectListAllDomains(conn, &doms, VIR_CONNECT_LIST_DOMAINS_ACTIVE);
    for (int i = 0; i < n; i++) {
        const char *name = virDomainGetName(doms[i]);
        char *out = NULL;
        json_t *rep = NULL, *blk;
        struct cfg_vm *m;
        size_t k;
        int known = 0;

        for (int v = 0; v < cfg->nvms; v++)
            known |= strcmp(cfg->vms[v].domain, name) == 0 ||
                     strcmp(cfg->vms[v].name, name) == 0;
        if (known || cfg->nvms == CFG_MAX_VMS)
            goto next;
        if (virDomainQemuMonitorCommand(doms[i], "{\"execute\":\"query-block\"}",
                                        &out, 0) < 0) {
            log_warnx("event=discover_failed domain=%s msg=\"%s\"", name,
                      virGetLastErrorMessage());
            goto next;
        }
        m = &cfg->vms[cfg->nvms];
        memset(m, 0, sizeof(*m));
        SET(m->name, name);
        SET(m->domain, name);
        SET(m->driver, vm_libvirt_ops.name);
        rep = json_loads(out, 0, NULL);
        json_array_foreach(json_object_get(rep, "return"), k, blk)
            if (m->ndisks < CFG_MAX_DISKS &&
                disk_from_block(blk, &m->disks[m->ndisks]) == 0)
                m->ndisks++;
        m->method = CFG_METHOD_QMP;
        if (m->ndisks > 0 && cfg->ceph_conf[0]) {
            m->method = CFG_METHOD_RBD;
            for (int d = 0; d < m->ndisks; d++)
                if (m->disks[d].backend != CFG_BACKEND_RBD)
                    m->method = CFG_METHOD_QMP;
        }
        cfg->nvms++;
        log_info("event=discovered domain=%s disks=%d", name, m->ndisks);
next:
        free(out);
        json_decref(rep);
        virDomainFree(doms[i]);
    }
    free(doms);
}

static int
lv_open(struct vm *v, void *conn)
{
    v->priv = conn;
    return 0;
}

static virDomainPtr
lookup(struct vm *v, struct qmp_err *err)
{
    virDomainPtr d = v->priv ? virDomainLookupByName(v->priv, v->cfg->domain)
                             : NULL;

    if (!d)
        lv_err(err, "virDomainLookupByName");
    return d;
}

/* Raw QMP through libvirt; the caller holds the VM's mutex. */
static int
lv_qmp_locked(struct vm *v, const char *cmd, json_t *args, json_t **ret,
              struct qmp_err *err)
{
    virDomainPtr d = NULL;
    json_t *req = NULL, *rep = NULL, *e;
    char *s = NULL, *out = NULL;
    int rc = -1;

    if (!(d = lookup(v, err)))
        goto cleanup;
    req = json_pack("{s:s}", "execute", cmd);
    if (args)
        json_object_set(req, "arguments", args);
    s = json_dumps(req, JSON_COMPACT);
    log_debug("event=qmp_send vm=%s via=libvirt json=%s", v->cfg->name, s);
    if (virDomainQemuMonitorCommand(d, s, &out, 0) < 0) {
        lv_err(err, cmd);
        goto cleanup;
    }
    log_debug("event=qmp_recv vm=%s via=libvirt json=%s", v->cfg->name, out);
    rep = json_loads(out, 0, NULL);
    /* A reply that is neither a return nor an error is a failure: taking
     * it as success would report a refused snapshot as made (invariant 3). */
    if (!json_is_object(rep) || (!json_object_get(rep, "error") &&
                                 !json_object_get(rep, "return"))) {
        err->kind = QMP_E_PROTO;
        err->cls[0] = '\0';
        snprintf(err->msg, sizeof(err->msg), "%s: libvirt returned a reply "
                 "with neither return nor error", cmd);
        goto cleanup;
    }
    if ((e = json_object_get(rep, "error"))) {
        const char *desc = json_string_value(json_object_get(e, "desc"));
        err->kind = QMP_E_ERROR;
        snprintf(err->cls, sizeof(err->cls), "%s",
                 json_string_value(json_object_get(e, "class")) ?: "");
        snprintf(err->msg, sizeof(err->msg), "%s: %s", cmd, desc ? desc : "?");
        goto cleanup;
    }
    if (ret)
        *ret = json_incref(json_object_get(rep, "return"));
    rc = 0;
cleanup:
    if (d)
        virDomainFree(d);
    free(s);
    free(out);
    json_decref(req);
    json_decref(rep);
    json_decref(args);
    return rc;
}

static int
lv_qmp(struct vm *v, const char *cmd, json_t *args, int timeout_ms,
       json_t **ret, struct qmp_err *err)
{
    int rc;

    if (vm_lock(v, timeout_ms, err, cmd) < 0) {
        json_decref(args);
        return -1;
    }
    rc = lv_qmp_locked(v, cmd, args, ret, err);
    vm_unlock(v);
    return rc;
}

static int
lv_connect(struct vm *v, int timeout_ms, struct qmp_err *err)
{
    return lv_qmp(v, "query-status", NULL, timeout_ms, NULL, err);
}

static int
lv_pause(struct vm *v, int timeout_ms, struct qmp_err *err)
{
    virDomainPtr d;
    int rc = -1;

    if (vm_lock(v, timeout_ms, err, "suspend") < 0)
        return -1;
    if ((d = lookup(v, err))) {
        rc = virDomainSuspend(d);
        if (rc < 0)
            lv_err(err, "virDomainSuspend");
        virDomainFree(d);
    }
    vm_unlock(v);
    return rc;
}

static int
lv_resume(struct vm *v, int timeout_ms, struct qmp_err *err)
{
    virDomainPtr d;
    int rc = -1, st, reason;

    if (vm_lock(v, timeout_ms, err, "resume") < 0)
        return -1;
    if ((d = lookup(v, err))) {
        /* virDomainResume of a running domain is an error; resuming a
         * running VM is fine in our protocol (§4.6). */
        if (virDomainGetState(d, &st, &reason, 0) == 0 &&
            st == VIR_DOMAIN_RUNNING)
            rc = 0;
        else if ((rc = virDomainResume(d)) < 0)
            lv_err(err, "virDomainResume");
        virDomainFree(d);
    }
    vm_unlock(v);
    return rc;
}

static const char *
lv_state(struct vm *v, int timeout_ms)
{
    struct qmp_err err;
    const char *s = "unknown";
    virDomainPtr d;
    int st, reason;

    if (vm_lock(v, timeout_ms, &err, "state") < 0)
        return s;
    if ((d = lookup(v, &err))) {
        if (virDomainGetState(d, &st, &reason, 0) == 0)
            s = st == VIR_DOMAIN_RUNNING ? "running" :
                st == VIR_DOMAIN_PAUSED ? "paused" :
                st == VIR_DOMAIN_SHUTOFF ? "shutoff" : "unknown";
        virDomainFree(d);
    } else {
        s = "shutoff";
    }
    vm_unlock(v);
    return s;
}

static int
lv_poweroff(struct vm *v, int timeout_ms, struct qmp_err *err)
{
    virDomainPtr d;
    int rc = -1;

    if (vm_lock(v, timeout_ms, err, "destroy") < 0)
        return -1;
    if ((d = lookup(v, err))) {
        rc = virDomainDestroy(d);
        if (rc < 0)
            lv_err(err, "virDomainDestroy");
        virDomainFree(d);
    }
    vm_unlock(v);
    return rc;
}

const struct vm_ops vm_libvirt_ops = {
    .name = "libvirt",
    .config_check = lv_config_check,
    .conn_open = lv_conn_open,
    .conn_close = lv_conn_close,
    .discover = lv_discover,
    .open = lv_open,
    .connect = lv_connect,
    .pause = lv_pause,
    .resume = lv_resume,
    .state = lv_state,
    .qmp = lv_qmp,
    .poweroff = lv_poweroff,
    .guest_configured = guest_qga_configured,
    .guest_open = guest_qga_open,
    .guest_freeze = guest_qga_freeze,
    .guest_thaw = guest_qga_thaw,
    .guest_close = guest_qga_close,
};
