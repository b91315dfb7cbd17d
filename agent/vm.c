/* vm: see vm.h. */
#include "vm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <libvirt/libvirt-qemu.h>
#include <libvirt/virterror.h>

#include "log.h"
#include "qga.h"

static void
lv_err(struct qmp_err *err, const char *what)
{
    const char *m = virGetLastErrorMessage();

    err->kind = QMP_E_ERROR;
    err->cls[0] = '\0';
    snprintf(err->msg, sizeof(err->msg), "%s: %s", what, m ? m : "error");
}

const char *
vm_err_code(const struct qmp_err *err)
{
    return err->kind == QMP_E_TIMEOUT ? "QMP_TIMEOUT" : "QMP_ERROR";
}

/* QMP events of the VM: STOP/RESUME are our own doing (debug); the ones
 * that mean the guest went away are worth an info line. */
static void
on_qmp_event(const char *event, json_t *msg, void *opaque)
{
    const struct vm *v = opaque;

    (void)msg;
    if (strcmp(event, "SHUTDOWN") == 0 || strcmp(event, "GUEST_PANICKED") == 0
        || strcmp(event, "RESET") == 0)
        log_info("event=qmp_event vm=%s qmp_event=%s", v->cfg->name, event);
    else
        log_debug("event=qmp_event vm=%s qmp_event=%s", v->cfg->name, event);
}

/* snap_mon.call over vm_qmp: the monitor the QMP snapshot backend uses. */
static int
snap_call(void *opaque, const char *cmd, json_t *args, int timeout_ms,
          json_t **ret, struct snap_err *err)
{
    struct qmp_err qe;

    if (vm_qmp(opaque, cmd, args, timeout_ms, ret, &qe) == 0)
        return 0;
    err->kind = qe.kind == QMP_E_TIMEOUT ? SNAP_E_TIMEOUT :
                qe.kind == QMP_E_ERROR ? SNAP_E_REFUSED : SNAP_E_MONITOR;
    snprintf(err->msg, sizeof(err->msg), "%s", qe.msg);
    return -1;
}

void
vm_snap_disk(struct vm *v, int d, struct snap_disk *out)
{
    out->node = v->cfg->disks[d].node;
    out->img = v->img[d];
    out->mon = &v->mon;
}

int
vm_init(struct vm *v, const struct cfg_vm *cfg, virConnectPtr conn)
{
    memset(v, 0, sizeof(*v));
    v->cfg = cfg;
    v->conn = conn;
    v->snap = snap_backend_find(config_method_name(cfg->method));
    if (!v->snap)
        return -1;
    v->mon.call = snap_call;
    v->mon.opaque = v;
    pthread_mutex_init(&v->mu, NULL);
    if (cfg->driver == CFG_DRIVER_QMP) {
        v->qmp = qmp_new(cfg->qmp);
        if (!v->qmp)
            return -1;
        qmp_set_event_cb(v->qmp, on_qmp_event, v);
    }
    return 0;
}

void
vm_destroy(struct vm *v)
{
    if (!v || !v->cfg)
        return;
    for (int i = 0; i < CFG_MAX_DISKS; i++)
        rbdsnap_image_free(v->img[i]);
    qmp_free(v->qmp);
    qga_free(v->qga);
    v->qga = NULL;
    pthread_mutex_destroy(&v->mu);
    v->cfg = NULL;
}

static virDomainPtr
lookup(struct vm *v, struct qmp_err *err)
{
    virDomainPtr d = v->conn ? virDomainLookupByName(v->conn, v->cfg->domain)
                             : NULL;

    if (!d)
        lv_err(err, "virDomainLookupByName");
    return d;
}

/* Bounded lock: a VM stuck in a long call does not stall unrelated
 * requests (inventory, resume of other VMs) beyond the deadline. */
static int
lock_vm(struct vm *v, int timeout_ms, struct qmp_err *err, const char *what)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    if (pthread_mutex_timedlock(&v->mu, &ts) != 0) {
        err->kind = QMP_E_TIMEOUT;
        err->cls[0] = '\0';
        snprintf(err->msg, sizeof(err->msg), "%s: vm %s is busy with a call "
                 "that has not returned", what, v->cfg->name);
        return -1;
    }
    return 0;
}

static int
lv_qmp(struct vm *v, const char *cmd, json_t *args, json_t **ret,
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

int
vm_qmp(struct vm *v, const char *cmd, json_t *args, int timeout_ms,
       json_t **ret, struct qmp_err *err)
{
    int rc;

    if (lock_vm(v, timeout_ms, err, cmd) < 0) {
        json_decref(args);
        return -1;
    }
    if (v->cfg->driver == CFG_DRIVER_QMP)
        rc = qmp_call(v->qmp, cmd, args, timeout_ms, ret, err);
    else
        rc = lv_qmp(v, cmd, args, ret, err);
    pthread_mutex_unlock(&v->mu);
    return rc;
}

int
vm_stop(struct vm *v, int timeout_ms, struct qmp_err *err)
{
    virDomainPtr d;
    int rc;

    if (v->cfg->driver == CFG_DRIVER_QMP)
        return vm_qmp(v, "stop", NULL, timeout_ms, NULL, err);
    if (lock_vm(v, timeout_ms, err, "suspend") < 0)
        return -1;
    rc = -1;
    if ((d = lookup(v, err))) {
        rc = virDomainSuspend(d);
        if (rc < 0)
            lv_err(err, "virDomainSuspend");
        virDomainFree(d);
    }
    pthread_mutex_unlock(&v->mu);
    return rc;
}

int
vm_cont(struct vm *v, int timeout_ms, struct qmp_err *err)
{
    virDomainPtr d;
    int rc, st, reason;

    if (v->cfg->driver == CFG_DRIVER_QMP)
        return vm_qmp(v, "cont", NULL, timeout_ms, NULL, err);
    if (lock_vm(v, timeout_ms, err, "resume") < 0)
        return -1;
    rc = -1;
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
    pthread_mutex_unlock(&v->mu);
    return rc;
}

const char *
vm_state(struct vm *v, int timeout_ms)
{
    struct qmp_err err;
    json_t *ret = NULL;
    const char *s = "unknown";
    virDomainPtr d;
    int st, reason;

    if (v->cfg->driver == CFG_DRIVER_LIBVIRT) {
        if (lock_vm(v, timeout_ms, &err, "state") < 0)
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
        pthread_mutex_unlock(&v->mu);
        return s;
    }
    if (vm_qmp(v, "query-status", NULL, timeout_ms, &ret, &err) < 0)
        return err.kind == QMP_E_IO && !strstr(err.msg, "busy") ?
            "shutoff" : "unknown";
    if (json_is_true(json_object_get(ret, "running")))
        s = "running";
    else if (json_is_string(json_object_get(ret, "status")))
        s = strcmp(json_string_value(json_object_get(ret, "status")),
                   "shutdown") == 0 ? "shutoff" : "paused";
    json_decref(ret);
    return s;
}

int
vm_poweroff(struct vm *v, int timeout_ms, struct qmp_err *err)
{
    virDomainPtr d;
    int rc = -1;

    if (v->cfg->driver == CFG_DRIVER_QMP) {
        rc = vm_qmp(v, "quit", NULL, timeout_ms, NULL, err);
        if (rc < 0 && err->kind == QMP_E_IO)
            rc = 0;     /* QEMU may close before replying */
        return rc;
    }
    if (lock_vm(v, timeout_ms, err, "destroy") < 0)
        return -1;
    if ((d = lookup(v, err))) {
        rc = virDomainDestroy(d);
        if (rc < 0)
            lv_err(err, "virDomainDestroy");
        virDomainFree(d);
    }
    pthread_mutex_unlock(&v->mu);
    return rc;
}
