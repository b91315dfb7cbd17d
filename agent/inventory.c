/* inventory: see inventory.h. */
#include "inventory.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "bringup.h"
#include "log.h"
#include "mono.h"
#include "par.h"
#include "rbdsnap.h"
#include "recover.h"
#include "redirect.h"

/* A hung QEMU shows `unknown` rather than delaying the reply. */
#define INVENTORY_TIMEOUT_MS 500
/* Disks still to open are tried this often; a failure is logged at most
 * every WARN_EVERY_MS per VM. */
#define TICK_MS 2000.0
#define WARN_EVERY_MS 30000.0

/* ---- adoption ----------------------------------------------------------- */

static void
on_change(void *opaque)
{
    inventory_kick(opaque);
}

void
inventory_kick(struct agent *a)
{
    pthread_mutex_lock(&a->mu);
    a->inv_kick = 1;
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->mu);
}

/* Makes m (copied) a VM of the agent: opened, then published. */
static void
publish(struct agent *a, const struct cfg_vm *m)
{
    int idx = a->cfg.nvms;
    struct vm *v = &a->vms[idx];
    struct qmp_err e;

    a->cfg.vms[idx] = *m;
    if (vm_open(v, &a->cfg.vms[idx], &a->host) < 0) {
        log_warnx("event=vm_adopt_failed vm=%s msg=\"cannot open\"", m->name);
        return;
    }
    pthread_mutex_lock(&a->mu);
    /* its disks are opened by bringup's images step or by our thread */
    v->storage_pending = 1;
    a->cfg.nvms++;
    a->nvms++;              /* published: requests may find it now */
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->mu);
    log_info("event=vm_adopted vm=%s driver=%s disks=%d method=%s",
             m->name, v->ops->name, m->ndisks, config_method_name(m->method));
    recover_adopted(a, v);
    if (vm_connect(v, 2000, &e) < 0)
        log_warnx("event=qmp_connect_failed vm=%s msg=\"%s\"", m->name,
                  e.msg);
}

int
inventory_adopt(struct agent *a)
{
    const struct vm_ops *d;
    int added = 0;

    pthread_mutex_lock(&a->adopt_mu);
    for (int i = 0; (d = vm_driver_at(i)); i++) {
        void *conn = vm_host_conn(&a->host, i);
        int room = CFG_MAX_VMS - a->cfg.nvms, n;
        struct cfg_vm *found;

        if (!conn || !d->discover)
            continue;
        if (room <= 0 || !(found = calloc((size_t)room, sizeof(*found)))) {
            if (!a->inv_full_warned)
                log_warnx("event=vm_adopt_failed driver=%s msg=\"the agent "
                          "manages %d VMs, its most\"", d->name,
                          CFG_MAX_VMS);
            a->inv_full_warned = 1;
            continue;
        }
        n = d->discover(conn, &a->cfg, found, room);
        for (int k = 0; k < n; k++, added++)
            publish(a, &found[k]);
        free(found);
    }
    pthread_mutex_unlock(&a->adopt_mu);
    return added;
}

/* Opens the rbd images v still needs: an adopted VM's, or a standby's
 * that came up without vm.start.  Claims v with `starting` meanwhile, so
 * that vm.start and prepare wait (BUSY). */
static void
open_disks(struct agent *a, int i)
{
    struct vm *v = &a->vms[i];
    char err[512] = "";
    int pending, deferred, present, rc = 0, standby;
    double now = mono_ms();

    pthread_mutex_lock(&a->mu);
    pending = v->storage_pending;
    deferred = v->images_deferred;
    if (v->starting || now < a->images_retry_at[i] || (!pending && !deferred)) {
        pthread_mutex_unlock(&a->mu);
        return;
    }
    pthread_mutex_unlock(&a->mu);
    present = !v->ops->present || v->ops->present(v);
    standby = pending && vm_is_standby(v);
    if (deferred && !present)
        return;                         /* not up yet: vm.start opens them */
    pthread_mutex_lock(&a->mu);
    if (v->starting) {
        pthread_mutex_unlock(&a->mu);
        return;
    }
    v->starting = 1;
    pthread_mutex_unlock(&a->mu);
    if (standby)
        log_info("event=standby vm=%s images=deferred", v->cfg->name);
    else
        rc = agent_open_images(a, v, err, sizeof(err));
    pthread_mutex_lock(&a->mu);
    v->starting = 0;
    if (rc == 0) {
        v->storage_pending = 0;
        v->images_deferred = standby;
    } else {
        a->images_retry_at[i] = now + TICK_MS;
    }
    pthread_mutex_unlock(&a->mu);
    if (rc < 0 && now >= a->images_warned_at[i]) {
        a->images_warned_at[i] = now + WARN_EVERY_MS;
        log_warnx("event=rbd_open_deferred vm=%s retry_ms=%.0f msg=\"%s\"",
                  v->cfg->name, TICK_MS, err);
    }
}

static void *
inventory_main(void *arg)
{
    struct agent *a = arg;
    double next = 0;

    pthread_mutex_lock(&a->mu);
    while (!a->stopping) {
        double now = mono_ms();
        int kick, n;

        if (!bringup_done(a) || (!a->inv_kick && now < next)) {
            agent_wait(a, bringup_done(a) ? next - now : TICK_MS);
            continue;
        }
        kick = a->inv_kick;
        a->inv_kick = 0;
        pthread_mutex_unlock(&a->mu);
        if (kick)
            inventory_adopt(a);
        pthread_mutex_lock(&a->mu);
        n = a->nvms;
        pthread_mutex_unlock(&a->mu);
        for (int i = 0; i < n; i++)
            open_disks(a, i);
        /* overlays of the redirect cut whose QEMU is gone */
        redirect_watch(a);
        pthread_mutex_lock(&a->mu);
        next = mono_ms() + TICK_MS;
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

int
inventory_start(struct agent *a, char *err, size_t errlen)
{
    uint64_t id = 0;

    if (getrandom(&id, sizeof(id), 0) != sizeof(id))
        id = (uint64_t)(mono_ms() * 1000);
    snprintf(a->instance, sizeof(a->instance), "%016llx",
             (unsigned long long)id);
    if (pthread_create(&a->inventory, NULL, inventory_main, a) != 0) {
        snprintf(err, errlen, "cannot start the inventory thread");
        return -1;
    }
    a->inventory_started = 1;
    return 0;
}

void
inventory_watch(struct agent *a)
{
    const struct vm_ops *d;

    for (int i = 0; (d = vm_driver_at(i)); i++)
        if (vm_host_conn(&a->host, i) && d->conn_watch)
            d->conn_watch(vm_host_conn(&a->host, i), on_change, a);
}

void
inventory_join(struct agent *a)
{
    if (a->inventory_started)
        pthread_join(a->inventory, NULL);
    a->inventory_started = 0;
}

/* ---- the reply ---------------------------------------------------------- */

static json_t *
disk_json(const struct vm *v, int d)
{
    const struct cfg_disk *dk = &v->cfg->disks[d];
    json_t *o = json_pack("{s:s++,s:s,s:s}", "id", v->cfg->name, "/",
                          dk->node, "node", dk->node, "backend",
                          dk->backend == CFG_BACKEND_RBD ? "rbd" : "qcow2");

    if (dk->backend == CFG_BACKEND_RBD) {
        json_object_set_new(o, "pool", json_string(dk->pool));
        json_object_set_new(o, "image", json_string(dk->image));
        /* known once the image is open (bringup, or when a standby runs) */
        if (rbdsnap_size(v->img[d]))
            json_object_set_new(o, "size", json_integer(
                (json_int_t)rbdsnap_size(v->img[d])));
    } else {
        json_object_set_new(o, "file", json_string(dk->file));
    }
    return o;
}

struct inv_job {
    struct vm *vm;
    json_t *o;
    int gone;
};

static void *
inv_one(void *arg)
{
    struct inv_job *j = arg;
    struct vm *v = j->vm;
    json_t *disks = json_array(), *uuid;

    for (int d = 0; d < v->cfg->ndisks; d++)
        json_array_append_new(disks, disk_json(v, d));
    j->o = json_pack("{s:s,s:s,s:s,s:o,s:b}", "name", v->cfg->name,
                     "driver", v->ops->name, "method", v->snap->name,
                     "disks", disks, "stale", 0);
    if (v->ops->describe)
        j->gone = v->ops->describe(v, j->o) == 1;
    else
        json_object_set_new(j->o, "state", json_string(
            vm_state(v, INVENTORY_TIMEOUT_MS)));
    /* The identity that survives a move to another host: the libvirt
     * domain's UUID (describe set it), or the configured id. */
    uuid = json_object_get(j->o, "uuid");
    json_object_set_new(j->o, "uid", json_is_string(uuid) ? json_incref(uuid)
                        : v->cfg->uid[0] ? json_string(v->cfg->uid)
                        : json_null());
    return NULL;
}

/* FNV-1a, 64 bits: a digest of what the reply says, to number versions. */
static uint64_t
fnv(uint64_t h, const char *s)
{
    for (; s && *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

json_t *
inventory_json(struct agent *a)
{
    struct inv_job *jobs = calloc(CFG_MAX_VMS, sizeof(*jobs));
    json_t *vms = json_array(), *conns = json_array(), *c;
    const struct vm_ops *d;
    uint64_t h = 14695981039346656037ULL;
    char *s;
    long gen;
    int n, stale = 0;

    pthread_mutex_lock(&a->mu);
    n = a->nvms;
    pthread_mutex_unlock(&a->mu);
    for (int i = 0; jobs && i < n; i++)
        jobs[i].vm = &a->vms[i];
    if (jobs && n)
        par_run(inv_one, jobs, sizeof(*jobs), n);
    pthread_mutex_lock(&a->mu);
    for (int i = 0; jobs && i < n; i++) {
        const struct vm *v = &a->vms[i];

        if (jobs[i].gone) {
            json_decref(jobs[i].o);
            continue;
        }
        /* false while a prepare of it would be BUSY for want of its
         * connection or disks (bringup, adoption, vm.start) */
        json_object_set_new(jobs[i].o, "ready", json_boolean(
            !v->storage_pending && !v->starting));
        json_array_append_new(vms, jobs[i].o);
    }
    pthread_mutex_unlock(&a->mu);
    free(jobs);
    for (int i = 0; (d = vm_driver_at(i)); i++) {
        void *conn = vm_host_conn(&a->host, i);

        if (!conn || !d->conn_describe)
            continue;
        c = json_pack("{s:s}", "driver", d->name);
        d->conn_describe(conn, c);
        stale |= !json_is_true(json_object_get(c, "connected"));
        /* what changes the inventory, not the clock (since_ms) */
        h = fnv(h, json_is_true(json_object_get(c, "connected")) ? "up" :
                "down");
        h = fnv(h, (s = json_dumps(json_object_get(c, "events"),
                                   JSON_ENCODE_ANY)));
        free(s);
        h = fnv(h, (s = json_dumps(json_object_get(c, "epoch"),
                                   JSON_ENCODE_ANY)));
        free(s);
        json_array_append_new(conns, c);
    }
    h = fnv(h, (s = json_dumps(vms, JSON_COMPACT | JSON_SORT_KEYS)));
    free(s);
    pthread_mutex_lock(&a->mu);
    if (a->inv_generation == 0 || h != a->inv_digest) {
        a->inv_generation++;
        a->inv_digest = h;
    }
    gen = a->inv_generation;
    pthread_mutex_unlock(&a->mu);
    return json_pack("{s:o,s:I,s:s,s:b,s:o}", "vms", vms, "generation",
                     (json_int_t)gen, "instance", a->instance, "stale", stale,
                     "connections", conns);
}
