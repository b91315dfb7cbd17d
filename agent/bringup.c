/* bringup: see bringup.h. */
#include "bringup.h"

#include <stdio.h>
#include <string.h>

#include "inventory.h"
#include "log.h"
#include "mono.h"
#include "rbdsnap.h"
#include "recover.h"

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#define BACKOFF_FIRST_MS 500.0
#define BACKOFF_MAX_MS 30000.0

enum step { STEP_HYPERVISOR, STEP_CEPH, STEP_IMAGES, STEP_DONE };

static const char *const step_name[] = {
    [STEP_HYPERVISOR] = "hypervisor",
    [STEP_CEPH] = "ceph",
    [STEP_IMAGES] = "images",
};

/* 1 when some VM has an rbd disk. */
static int
need_ceph(const struct agent *a)
{
    for (int i = 0; i < a->nvms; i++)
        for (int d = 0; d < a->cfg.vms[i].ndisks; d++)
            if (a->cfg.vms[i].disks[d].backend == CFG_BACKEND_RBD)
                return 1;
    return 0;
}

/* Hypervisor connections (libvirt): opened once, then waited for until
 * each knows its VMs; given to the configured VMs of their driver, which
 * may take their disks from it; then the VMs discovery adds. */
static int
step_hypervisor(struct agent *a, char *err, size_t errlen)
{
    if (!a->host_open) {
        if (vm_host_open(&a->host, &a->cfg, err, errlen) < 0) {
            vm_host_close(&a->host);
            return -1;
        }
        a->host_open = 1;
        inventory_watch(a);
    }
    if (vm_host_ready(&a->host, err, errlen) < 0)
        return -1;
    for (int i = 0; i < a->nvms; i++) {
        vm_attach(&a->vms[i], &a->host);
        vm_fill(&a->vms[i], &a->host, &a->cfg);
    }
    inventory_adopt(a);
    return 0;
}

static int
step_ceph(struct agent *a, char *err, size_t errlen)
{
    struct rbdsnap_cluster *c = NULL;

    /* with discovery, a domain with rbd disks may come later */
    if ((!need_ceph(a) && !a->cfg.libvirt_discover) || !a->cfg.ceph_conf[0])
        return 0;
    if (rbdsnap_connect(a->cfg.ceph_conf, a->cfg.ceph_id,
                        a->cfg.ceph_keyring[0] ? a->cfg.ceph_keyring : NULL,
                        &c, err, errlen) < 0)
        return -1;
    pthread_mutex_lock(&a->mu);
    a->ceph = c;
    pthread_mutex_unlock(&a->mu);
    recover_fence(a);
    return 0;
}

/* Images are opened once, now, so that commit holds no open.  A standby
 * VM (start =, no QMP socket yet: a DR copy that failover boots) is the
 * exception: its images may not exist yet (the first replication creates
 * them) and an open handle would watch images that replication and
 * rollback rewrite; vm.start opens them. */
static int
step_images(struct agent *a, char *err, size_t errlen)
{
    int rc = 0;

    for (int i = 0; i < a->nvms; i++) {
        struct vm *v = &a->vms[i];
        char e[256] = "", why[256];

        pthread_mutex_lock(&a->mu);
        if (!v->storage_pending) {
            pthread_mutex_unlock(&a->mu);
            continue;
        }
        pthread_mutex_unlock(&a->mu);
        if (vm_is_standby(v)) {
            v->images_deferred = 1;
            log_info("event=standby vm=%s qmp=%s images=deferred",
                     v->cfg->name, v->cfg->qmp);
        } else if (a->ceph && agent_open_images(a, v, e, sizeof(e)) < 0) {
            if (!vm_startable(v, why, sizeof(why))) {
                snprintf(err, errlen, "%s", e);
                rc = -1;
                continue;       /* the others need not wait for this one */
            }
            v->images_deferred = 1;
            log_warnx("event=rbd_open_deferred vm=%s msg=\"%s\"",
                      v->cfg->name, e);
        }
        pthread_mutex_lock(&a->mu);
        v->storage_pending = 0;
        pthread_mutex_unlock(&a->mu);
    }
    return rc;
}

static int
run_step(struct agent *a, enum step s, char *err, size_t errlen)
{
    switch (s) {
    case STEP_HYPERVISOR:
        return step_hypervisor(a, err, errlen);
    case STEP_CEPH:
        return step_ceph(a, err, errlen);
    case STEP_IMAGES:
        return step_images(a, err, errlen);
    default:
        return 0;
    }
}

static void *
bringup_main(void *arg)
{
    struct agent *a = arg;
    enum step s = STEP_HYPERVISOR;
    double backoff = BACKOFF_FIRST_MS;

    while (s != STEP_DONE) {
        char err[512] = "";
        double t0 = mono_ms();
        int stop;

        if (run_step(a, s, err, sizeof(err)) == 0) {
            log_info("event=bringup step=%s result=ok ms=%.3f", step_name[s],
                     mono_ms() - t0);
            s++;
            backoff = BACKOFF_FIRST_MS;
            continue;
        }
        log_warnx("event=bringup_retry step=%s retry_ms=%.0f msg=\"%s\"",
                  step_name[s], backoff, err);
        pthread_mutex_lock(&a->mu);
        for (double end = mono_ms() + backoff; !a->stopping &&
             mono_ms() < end;)
            agent_wait(a, end - mono_ms());
        stop = a->stopping;
        pthread_mutex_unlock(&a->mu);
        if (stop)
            break;
        backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2;
    }
    pthread_mutex_lock(&a->mu);
    a->bringup_state = s == STEP_DONE ? 2 : 3;
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->mu);
    if (s == STEP_DONE) {
        for (int i = 0; i < a->nvms; i++)
            log_info("event=vm vm=%s driver=%s method=%s disks=%d",
                     a->cfg.vms[i].name, a->vms[i].ops->name,
                     config_method_name(a->cfg.vms[i].method),
                     a->cfg.vms[i].ndisks);
        log_info("event=bringup result=done");
    }
    return NULL;
}

int
bringup_start(struct agent *a, char *err, size_t errlen)
{
    pthread_t th;
    pthread_attr_t at;
    int rc;

    pthread_mutex_lock(&a->mu);
    a->bringup_state = 1;
    pthread_mutex_unlock(&a->mu);
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    rc = pthread_create(&th, &at, bringup_main, a);
    pthread_attr_destroy(&at);
    if (rc != 0) {
        snprintf(err, errlen, "cannot start the bringup thread");
        return -1;
    }
    return 0;
}

int
bringup_done(const struct agent *a)
{
    return a->bringup_state == 2;
}
