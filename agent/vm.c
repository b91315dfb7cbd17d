/* vm: see vm.h.  The driver table, and the VM calls that go through it. */
#include "vm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mono.h"

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

/*
 * The driver table.  Its order is the order of `drivers` in hello, and
 * its index is the slot of a driver's connection in struct vm_host.
 */
static const struct vm_ops *const drivers[] = {
    &vm_qmp_ops,
    &vm_libvirt_ops,
};
#define NDRIVERS ((int)(sizeof(drivers) / sizeof(drivers[0])))
_Static_assert(sizeof(drivers) / sizeof(drivers[0]) <= VM_MAX_DRIVERS,
               "struct vm_host has a slot per driver");

const struct vm_ops *
vm_driver_at(int i)
{
    return i >= 0 && i < NDRIVERS ? drivers[i] : NULL;
}

static int
driver_index(const char *name)
{
    for (int i = 0; i < NDRIVERS; i++)
        if (name && strcmp(drivers[i]->name, name) == 0)
            return i;
    return -1;
}

const struct vm_ops *
vm_driver_find(const char *name)
{
    return vm_driver_at(driver_index(name));
}

int
vm_host_open(struct vm_host *h, struct agent_config *cfg, char *err,
             size_t errlen)
{
    memset(h, 0, sizeof(*h));
    for (int i = 0; i < NDRIVERS; i++)
        if (drivers[i]->conn_open &&
            drivers[i]->conn_open(cfg, &h->conn[i], err, errlen) < 0)
            return -1;
    return 0;
}

int
vm_host_ready(struct vm_host *h, char *err, size_t errlen)
{
    for (int i = 0; i < NDRIVERS; i++)
        if (h->conn[i] && drivers[i]->conn_ready &&
            drivers[i]->conn_ready(h->conn[i], err, errlen) < 0)
            return -1;
    return 0;
}

void *
vm_host_conn(struct vm_host *h, int i)
{
    return i >= 0 && i < NDRIVERS ? h->conn[i] : NULL;
}

void
vm_host_close(struct vm_host *h)
{
    for (int i = 0; i < NDRIVERS; i++) {
        if (h->conn[i] && drivers[i]->conn_close)
            drivers[i]->conn_close(h->conn[i]);
        h->conn[i] = NULL;
    }
}

const char *
vm_err_code(const struct qmp_err *err)
{
    return err->kind == QMP_E_TIMEOUT ? "QMP_TIMEOUT" : "QMP_ERROR";
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
    out->node = v->ops->monitor_node ? v->ops->monitor_node(v, d) :
                v->cfg->disks[d].node;
    out->img = v->img[d];
    out->mon = &v->mon;
}

int
vm_pause_bound(struct vm *v, int timeout_ms, struct snap_err *err)
{
    struct snap_disk d;
    struct snap_bound b;
    double now = mono_ms();
    int sum = 0;

    if (!v->snap->pause_bound ||
        (v->bound_at > 0 && now - v->bound_at < VM_BOUND_TTL_MS))
        return 0;
    snprintf(v->bound_why, sizeof(v->bound_why), "no storage wait");
    for (int k = 0; k < v->cfg->ndisks; k++) {
        /* A file disk (qcow2:) waits on no network storage. */
        if (v->cfg->disks[k].backend != CFG_BACKEND_RBD)
            continue;
        vm_snap_disk(v, k, &d);
        if (v->snap->pause_bound(&d, timeout_ms, &b, err) < 0)
            return -1;
        if (!b.storage)
            continue;
        if (b.bound_ms < 0) {
            sum = -1;
            snprintf(v->bound_why, sizeof(v->bound_why), "%s", b.why);
            break;
        }
        sum += b.bound_ms;
        snprintf(v->bound_why, sizeof(v->bound_why), "%s", b.why);
    }
    v->bound_ms = sum;
    v->bound_at = now;
    return 0;
}

int
vm_open(struct vm *v, const struct cfg_vm *cfg, struct vm_host *h)
{
    int i = driver_index(cfg->driver);

    memset(v, 0, sizeof(*v));
    if (i < 0)
        return -1;
    v->cfg = cfg;
    v->ops = drivers[i];
    v->snap = snap_backend_find(config_method_name(cfg->method));
    if (!v->snap)
        return -1;
    v->mon.call = snap_call;
    v->mon.opaque = v;
    pthread_mutex_init(&v->mu, NULL);
    if (v->ops->open && v->ops->open(v, h ? h->conn[i] : NULL) < 0) {
        pthread_mutex_destroy(&v->mu);
        v->cfg = NULL;
        return -1;
    }
    return 0;
}

void
vm_attach(struct vm *v, struct vm_host *h)
{
    int i = driver_index(v->cfg->driver);

    if (i < 0 || !h->conn[i] || !v->ops->conn_open || !v->ops->open)
        return;
    /* open again, with the connection (the driver keeps its state: a
     * resume retry may be using it) */
    pthread_mutex_lock(&v->mu);
    v->ops->open(v, h->conn[i]);
    pthread_mutex_unlock(&v->mu);
}

void
vm_fill(struct vm *v, struct vm_host *h, const struct agent_config *cfg)
{
    int i = driver_index(v->cfg->driver);
    const struct snap_ops *snap;

    if (i < 0 || !h->conn[i] || !v->ops->fill ||
        !v->ops->fill(h->conn[i], cfg, (struct cfg_vm *)v->cfg))
        return;
    if ((snap = snap_backend_find(config_method_name(v->cfg->method))))
        v->snap = snap;
}

void
vm_close(struct vm *v)
{
    if (!v || !v->cfg)
        return;
    for (int i = 0; i < CFG_MAX_DISKS; i++)
        rbdsnap_image_free(v->img[i]);
    if (v->ops->close)
        v->ops->close(v);
    if (v->guest && v->ops->guest_close)
        v->ops->guest_close(v->guest);
    v->guest = NULL;
    pthread_mutex_destroy(&v->mu);
    v->cfg = NULL;
}

/* Bounded lock: a VM stuck in a long call does not stall unrelated
 * requests (inventory, resume of other VMs) beyond the deadline. */
int
vm_lock(struct vm *v, int timeout_ms, struct qmp_err *err, const char *what)
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

void
vm_unlock(struct vm *v)
{
    pthread_mutex_unlock(&v->mu);
}

/* An operation the VM's driver does not have. */
static int
unsupported(struct vm *v, const char *what, struct qmp_err *err)
{
    err->kind = QMP_E_ERROR;
    err->cls[0] = '\0';
    snprintf(err->msg, sizeof(err->msg), "%s: vm %s: the %s driver cannot "
             "do this", what, v->cfg->name, v->ops->name);
    return -1;
}

int
vm_connect(struct vm *v, int timeout_ms, struct qmp_err *err)
{
    if (!v->ops->connect)
        return 0;
    return v->ops->connect(v, timeout_ms, err);
}

int
vm_stop(struct vm *v, int timeout_ms, struct qmp_err *err)
{
    return v->ops->pause(v, timeout_ms, err);
}

int
vm_stop_then(struct vm *v, const char *cmd, json_t *args, int timeout_ms,
             double *t_paused, int *which, struct qmp_err *err)
{
    if (v->ops->pause_then)
        return v->ops->pause_then(v, cmd, args, timeout_ms, t_paused, which,
                                  err);
    *which = 1;
    if (vm_stop(v, timeout_ms, err) < 0) {
        *t_paused = mono_ms();
        json_decref(args);
        return -1;
    }
    *t_paused = mono_ms();
    *which = 2;
    return vm_qmp(v, cmd, args, timeout_ms, NULL, err);
}

int
vm_cont(struct vm *v, int timeout_ms, struct qmp_err *err)
{
    return v->ops->resume(v, timeout_ms, err);
}

const char *
vm_state(struct vm *v, int timeout_ms)
{
    return v->ops->state(v, timeout_ms);
}

int
vm_qmp(struct vm *v, const char *cmd, json_t *args, int timeout_ms,
       json_t **ret, struct qmp_err *err)
{
    if (!v->ops->qmp) {
        json_decref(args);
        return unsupported(v, cmd, err);
    }
    return v->ops->qmp(v, cmd, args, timeout_ms, ret, err);
}

int
vm_poweroff(struct vm *v, int timeout_ms, struct qmp_err *err)
{
    if (!v->ops->poweroff)
        return unsupported(v, "vm.stop", err);
    return v->ops->poweroff(v, timeout_ms, err);
}

int
vm_may_discover(const struct agent_config *cfg)
{
    for (int i = 0; i < NDRIVERS; i++)
        if (drivers[i]->may_discover && drivers[i]->may_discover(cfg))
            return 1;
    return 0;
}

int
vm_startable(const struct vm *v, char *why, size_t len)
{
    if (!v->ops->start) {
        snprintf(why, len, "vm %s uses the %s driver, which cannot start a "
                 "VM", v->cfg->name, v->ops->name);
        return 0;
    }
    return !v->ops->startable || v->ops->startable(v, why, len);
}

int
vm_is_standby(const struct vm *v)
{
    char why[256];

    return vm_startable(v, why, sizeof(why)) && v->ops->present &&
           !v->ops->present(v);
}
