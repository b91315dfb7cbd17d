/* rbdsnap: see rbdsnap.h. */
#include "rbdsnap.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <rados/librados.h>
#include <rbd/librbd.h>

#include "mono.h"

struct rbdsnap_cluster {
    rados_t rados;
};

struct rbdsnap_image {
    rados_ioctx_t io;
    rbd_image_t image;
    uint64_t size;          /* at open: read without a call to Ceph */
    char spec[256];
};

int
rbdsnap_connect(const char *conf, const char *id, const char *keyring,
                struct rbdsnap_cluster **out, char *err, size_t errlen)
{
    struct rbdsnap_cluster *c = NULL;
    int r, ret = -1;
    const char *op = "rados_create";

    c = calloc(1, sizeof(*c));
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if ((r = rados_create(&c->rados, id)) < 0)
        goto cleanup;
    op = "rados_conf_read_file";
    if (conf && (r = rados_conf_read_file(c->rados, conf)) < 0)
        goto cleanup;
    op = "rados_conf_set keyring";
    if (keyring && (r = rados_conf_set(c->rados, "keyring", keyring)) < 0)
        goto cleanup;
    /* A dead cluster must not hang agent start forever. */
    rados_conf_set(c->rados, "client_mount_timeout", "15");
    rados_conf_set(c->rados, "rados_osd_op_timeout", "30");
    rados_conf_set(c->rados, "rados_mon_op_timeout", "30");
    op = "rados_connect";
    if ((r = rados_connect(c->rados)) < 0)
        goto cleanup;
    *out = c;
    c = NULL;
    ret = 0;
cleanup:
    if (ret < 0)
        snprintf(err, errlen, "%s: %s", op, strerror(-r));
    if (c) {
        if (c->rados)
            rados_shutdown(c->rados);
        free(c);
    }
    return ret;
}

int
rbdsnap_client_timeouts(const char *conf, const char *id,
                        const char *const *kv, int nkv, int *osd_s,
                        int *mon_s, char *err, size_t errlen)
{
    static const char *const keys[] = {"rados_osd_op_timeout",
                                       "rados_mon_op_timeout"};
    int *out[] = {osd_s, mon_s};
    rados_t r = NULL;
    char val[64];
    int rc, ret = -1;

    if ((rc = rados_create(&r, id)) < 0) {
        snprintf(err, errlen, "rados_create(%s): %s", id ? id : "admin",
                 strerror(-rc));
        return -1;
    }
    if ((rc = rados_conf_read_file(r, conf)) < 0 && conf) {
        snprintf(err, errlen, "cannot read %s: %s", conf, strerror(-rc));
        goto cleanup;
    }
    for (int i = 0; i < nkv; i++)
        if ((rc = rados_conf_set(r, kv[2 * i], kv[2 * i + 1])) < 0 &&
            rc != -ENOENT) {
            snprintf(err, errlen, "%s=%s: %s", kv[2 * i], kv[2 * i + 1],
                     strerror(-rc));
            goto cleanup;
        }
    for (int i = 0; i < 2; i++) {
        if ((rc = rados_conf_get(r, keys[i], val, sizeof(val))) < 0) {
            snprintf(err, errlen, "%s: %s", keys[i], strerror(-rc));
            goto cleanup;
        }
        *out[i] = atoi(val);
    }
    ret = 0;
cleanup:
    rados_shutdown(r);
    return ret;
}

void
rbdsnap_cluster_free(struct rbdsnap_cluster *c)
{
    if (!c)
        return;
    rados_shutdown(c->rados);
    free(c);
}

int
rbdsnap_client_addr(struct rbdsnap_cluster *c, char *buf, size_t len,
                    char *err, size_t errlen)
{
    char *addrs = NULL, *p, *end;
    int r = rados_getaddrs(c->rados, &addrs);

    if (r < 0) {
        snprintf(err, errlen, "rados_getaddrs: %s", strerror(-r));
        return -1;
    }
    /* "[v2:1.2.3.4:0/123,v1:...]" or "v2:1.2.3.4:0/123": keep the first
     * address without its type prefix. */
    p = addrs;
    if (*p == '[')
        p++;
    end = p + strcspn(p, ",]");
    *end = '\0';
    if (strncmp(p, "v2:", 3) == 0 || strncmp(p, "v1:", 3) == 0)
        p += 3;
    else if (strncmp(p, "any:", 4) == 0)
        p += 4;
    snprintf(buf, len, "%s", p);
    free(addrs);
    return 0;
}

int
rbdsnap_blocklist(struct rbdsnap_cluster *c, const char *addr,
                  unsigned expire_s, char *err, size_t errlen)
{
    char tmp[256];
    int r;

    snprintf(tmp, sizeof(tmp), "%s", addr);
    r = rados_blocklist_add(c->rados, tmp, expire_s);
    if (r < 0) {
        snprintf(err, errlen, "blocklist %s: %s", addr, strerror(-r));
        return -1;
    }
    return 0;
}

int
rbdsnap_open(struct rbdsnap_cluster *c, const char *pool, const char *image,
             struct rbdsnap_image **out, char *err, size_t errlen)
{
    struct rbdsnap_image *img;
    int r;

    img = calloc(1, sizeof(*img));
    if (!img) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    snprintf(img->spec, sizeof(img->spec), "%s/%s", pool, image);
    if ((r = rados_ioctx_create(c->rados, pool, &img->io)) < 0) {
        snprintf(err, errlen, "pool %s: %s", pool, strerror(-r));
        free(img);
        return -1;
    }
    if ((r = rbd_open(img->io, image, &img->image, NULL)) < 0) {
        snprintf(err, errlen, "rbd_open %s: %s", img->spec, strerror(-r));
        rados_ioctx_destroy(img->io);
        free(img);
        return -1;
    }
    if (rbd_get_size(img->image, &img->size) < 0)
        img->size = 0;
    *out = img;
    return 0;
}

uint64_t
rbdsnap_size(const struct rbdsnap_image *img)
{
    return img ? img->size : 0;
}

void
rbdsnap_image_free(struct rbdsnap_image *img)
{
    if (!img)
        return;
    rbd_close(img->image);
    rados_ioctx_destroy(img->io);
    free(img);
}

/* One probe read; two owners (the waiter, the completion): the last one
 * to let go frees it, so a completion after the waiter gave up is safe. */
struct rbdsnap_probe {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int done;
    int refs;
    char buf[512];
};

static void
probe_unref(struct rbdsnap_probe *p)
{
    int last;

    pthread_mutex_lock(&p->mu);
    last = --p->refs == 0;
    pthread_mutex_unlock(&p->mu);
    if (!last)
        return;
    pthread_cond_destroy(&p->cond);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

static void
probe_done(rbd_completion_t c, void *arg)
{
    struct rbdsnap_probe *p = arg;

    rbd_aio_release(c);
    pthread_mutex_lock(&p->mu);
    p->done = 1;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->mu);
    probe_unref(p);
}

int
rbdsnap_probe_start(struct rbdsnap_image *img, struct rbdsnap_probe **out,
                    char *err, size_t errlen)
{
    struct rbdsnap_probe *p = calloc(1, sizeof(*p));
    pthread_condattr_t ca;
    rbd_completion_t c;
    int r;

    if (!p) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cond, &ca);
    pthread_condattr_destroy(&ca);
    p->refs = 2;
    if ((r = rbd_aio_create_completion(p, probe_done, &c)) < 0) {
        snprintf(err, errlen, "probe %s: %s", img->spec, strerror(-r));
        p->refs = 1;
        probe_unref(p);
        return -1;
    }
    if ((r = rbd_aio_read(img->image, 0, sizeof(p->buf), p->buf, c)) < 0) {
        snprintf(err, errlen, "probe read %s: %s", img->spec, strerror(-r));
        rbd_aio_release(c);
        p->refs = 1;
        probe_unref(p);
        return -1;
    }
    *out = p;
    return 0;
}

int
rbdsnap_probe_wait(struct rbdsnap_probe *p, double deadline)
{
    struct timespec ts;
    int done;

    ts.tv_sec = (time_t)(deadline / 1e3);
    ts.tv_nsec = (long)((deadline - (double)ts.tv_sec * 1e3) * 1e6);
    if (ts.tv_nsec > 999999999L)
        ts.tv_nsec = 999999999L;
    pthread_mutex_lock(&p->mu);
    while (!p->done && mono_ms() < deadline)
        if (pthread_cond_timedwait(&p->cond, &p->mu, &ts) == ETIMEDOUT)
            break;
    done = p->done;
    pthread_mutex_unlock(&p->mu);
    probe_unref(p);
    return done ? 0 : 1;
}

static int
no_progress(uint64_t a, uint64_t b, void *arg)
{
    (void)a;
    (void)b;
    (void)arg;
    return 0;
}

int
rbdsnap_create(struct rbdsnap_image *img, const char *name, char *err,
               size_t errlen)
{
    int r;

    /* SKIP_QUIESCE: the VM is already stopped and drained by QMP `stop`;
     * quiesce notifications would only wait on watchers (QEMU ignores them). */
    r = rbd_snap_create2(img->image, name, RBD_SNAP_CREATE_SKIP_QUIESCE,
                         no_progress, NULL);
    if (r == -EEXIST) {
        snprintf(err, errlen, "rbd_snap_create %s@%s: a snapshot of that "
                 "name exists already", img->spec, name);
        return RBDSNAP_EEXIST;
    }
    if (r < 0) {
        snprintf(err, errlen, "rbd_snap_create %s@%s: %s", img->spec, name,
                 strerror(-r));
        return -1;
    }
    return 0;
}

int
rbdsnap_snap_id(struct rbdsnap_image *img, const char *name, uint64_t *id,
                char *err, size_t errlen)
{
    int r = rbd_snap_get_id(img->image, name, id);

    if (r == -ENOENT)
        return RBDSNAP_ENOENT;
    if (r < 0) {
        snprintf(err, errlen, "rbd_snap_get_id %s@%s: %s", img->spec, name,
                 strerror(-r));
        return -1;
    }
    return 0;
}

static void
owner_key(uint64_t id, char *key, size_t len)
{
    snprintf(key, len, "%s%llu", RBDSNAP_OWNER_PREFIX,
             (unsigned long long)id);
}

int
rbdsnap_set_owner(struct rbdsnap_image *img, uint64_t id, const char *txn,
                  char *err, size_t errlen)
{
    char key[64];
    int r;

    owner_key(id, key, sizeof(key));
    if ((r = rbd_metadata_set(img->image, key, txn)) < 0) {
        snprintf(err, errlen, "rbd_metadata_set %s %s: %s", img->spec, key,
                 strerror(-r));
        return -1;
    }
    return 0;
}

int
rbdsnap_owner(struct rbdsnap_image *img, uint64_t id, char *txn,
              size_t txnlen, char *err, size_t errlen)
{
    char key[64];
    size_t len = txnlen;
    int r;

    owner_key(id, key, sizeof(key));
    r = rbd_metadata_get(img->image, key, txn, &len);
    if (r == -ENOENT)
        return RBDSNAP_ENOENT;
    if (r < 0) {
        snprintf(err, errlen, "rbd_metadata_get %s %s: %s", img->spec, key,
                 strerror(-r));
        return -1;
    }
    txn[txnlen - 1] = '\0';
    return 0;
}

int
rbdsnap_remove_id(struct rbdsnap_image *img, uint64_t id, char *err,
                  size_t errlen)
{
    char key[64];
    int r = rbd_snap_remove_by_id(img->image, id);

    if (r == -ENOENT)
        return RBDSNAP_ENOENT;
    if (r < 0) {
        snprintf(err, errlen, "rbd_snap_remove_by_id %s@%llu: %s", img->spec,
                 (unsigned long long)id, strerror(-r));
        return -1;
    }
    /* The snapshot is gone; a key left behind only names a dead id. */
    owner_key(id, key, sizeof(key));
    r = rbd_metadata_remove(img->image, key);
    (void)r;
    return 0;
}

int
rbdsnap_exists(struct rbdsnap_image *img, const char *name, int *exists,
               char *err, size_t errlen)
{
    bool b = false;
    int r = rbd_snap_exists(img->image, name, &b);

    if (r < 0) {
        snprintf(err, errlen, "rbd_snap_exists %s@%s: %s", img->spec, name,
                 strerror(-r));
        return -1;
    }
    *exists = b;
    return 0;
}

int
rbdsnap_remove(struct rbdsnap_image *img, const char *name, char *err,
               size_t errlen)
{
    int r = rbd_snap_remove(img->image, name);

    if (r == -ENOENT)
        return RBDSNAP_ENOENT;
    if (r < 0) {
        snprintf(err, errlen, "rbd_snap_remove %s@%s: %s", img->spec, name,
                 strerror(-r));
        return -1;
    }
    return 0;
}

int
rbdsnap_list(struct rbdsnap_image *img, json_t **out, char *err,
             size_t errlen)
{
    rbd_snap_info_t *snaps = NULL;
    int max = 16, n, i, ret = -1;
    json_t *arr = NULL;

    for (;;) {
        snaps = calloc((size_t)max, sizeof(*snaps));
        if (!snaps) {
            snprintf(err, errlen, "out of memory");
            goto cleanup;
        }
        n = rbd_snap_list(img->image, snaps, &max);
        if (n != -ERANGE)
            break;
        free(snaps);
        snaps = NULL;
    }
    if (n < 0) {
        snprintf(err, errlen, "rbd_snap_list %s: %s", img->spec, strerror(-n));
        goto cleanup;
    }
    arr = json_array();
    for (i = 0; i < n; i++) {
        json_t *o = json_pack("{s:s,s:I,s:I}", "name", snaps[i].name, "id",
                              (json_int_t)snaps[i].id, "size",
                              (json_int_t)snaps[i].size);
        struct timespec ts;
        char owner[160], e[256];

        /* The sweeper of orphans needs both: whose it is, and its age. */
        if (rbd_snap_get_timestamp(img->image, snaps[i].id, &ts) == 0)
            json_object_set_new(o, "created", json_integer(ts.tv_sec));
        switch (rbdsnap_owner(img, snaps[i].id, owner, sizeof(owner), e,
                              sizeof(e))) {
        case 0:
            json_object_set_new(o, "owner", json_string(owner));
            break;
        case RBDSNAP_ENOENT:
            break;
        default:    /* unknown owner: the sweeper must leave it alone */
            json_object_set_new(o, "owner_error", json_string(e));
        }
        json_array_append_new(arr, o);
    }
    rbd_snap_list_end(snaps);
    *out = arr;
    arr = NULL;
    ret = 0;
cleanup:
    free(snaps);
    json_decref(arr);
    return ret;
}

int
rbdsnap_sibling_create(struct rbdsnap_image *img, const char *name,
                       uint64_t size, char *err, size_t errlen)
{
    int order = 0;
    int r = rbd_create(img->io, name, size, &order);

    if (r == -EEXIST)
        return RBDSNAP_EEXIST;
    if (r < 0) {
        snprintf(err, errlen, "rbd_create %s (next to %s): %s", name,
                 img->spec, strerror(-r));
        return -1;
    }
    return 0;
}

int
rbdsnap_sibling_remove(struct rbdsnap_image *img, const char *name,
                       char *err, size_t errlen)
{
    int r = rbd_remove(img->io, name);

    if (r == -ENOENT)
        return RBDSNAP_ENOENT;
    if (r < 0) {
        snprintf(err, errlen, "rbd_remove %s (next to %s): %s", name,
                 img->spec, strerror(-r));
        return -1;
    }
    return 0;
}

int
rbdsnap_open_ro(struct rbdsnap_cluster *c, const char *pool,
                const char *image, struct rbdsnap_image **out, char *err,
                size_t errlen)
{
    struct rbdsnap_image *img;
    int r;

    if (!(img = calloc(1, sizeof(*img)))) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    snprintf(img->spec, sizeof(img->spec), "%s/%s", pool, image);
    if ((r = rados_ioctx_create(c->rados, pool, &img->io)) < 0) {
        snprintf(err, errlen, "pool %s: %s", pool, strerror(-r));
        free(img);
        return -1;
    }
    if ((r = rbd_open_read_only(img->io, image, &img->image, NULL)) < 0) {
        snprintf(err, errlen, "rbd_open_read_only %s: %s", img->spec,
                 strerror(-r));
        rados_ioctx_destroy(img->io);
        free(img);
        return r == -ENOENT ? RBDSNAP_ENOENT : -1;
    }
    if (rbd_get_size(img->image, &img->size) < 0)
        img->size = 0;
    *out = img;
    return 0;
}

int
rbdsnap_read(struct rbdsnap_image *img, uint64_t off, size_t len, void *buf,
             char *err, size_t errlen)
{
    ssize_t r = rbd_read(img->image, off, len, buf);

    if (r < 0 || (size_t)r != len) {
        snprintf(err, errlen, "rbd_read %s at %llu (%zu bytes): %s",
                 img->spec, (unsigned long long)off, len,
                 r < 0 ? strerror((int)-r) : "short read");
        return -1;
    }
    return 0;
}

int
rbdsnap_image_remove(struct rbdsnap_cluster *c, const char *pool,
                     const char *name, char *err, size_t errlen)
{
    rados_ioctx_t io;
    int r;

    if ((r = rados_ioctx_create(c->rados, pool, &io)) < 0) {
        snprintf(err, errlen, "pool %s: %s", pool, strerror(-r));
        return -1;
    }
    r = rbd_remove(io, name);
    rados_ioctx_destroy(io);
    if (r == -ENOENT)
        return RBDSNAP_ENOENT;
    if (r < 0) {
        snprintf(err, errlen, "rbd_remove %s/%s: %s", pool, name,
                 r == -EBUSY ? "busy (a client still watches it)" :
                 strerror(-r));
        return -1;
    }
    return 0;
}
