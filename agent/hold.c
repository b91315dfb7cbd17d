/* hold: see hold.h. */
#include "hold.h"

#include <stdio.h>
#include <string.h>

#include "log.h"
#include "mono.h"

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

/* Where QEMU puts the devices of its command line: with an id, and
 * without. */
static const char *const dev_roots[] = {"/machine/peripheral",
                                        "/machine/peripheral-anon"};

/* Device types through which a guest talks past QEMU's network layer: a
 * filter on a netdev does not see what they carry. */
static const char *const unfilterable[] = {"vfio", "ivshmem", "vhost-user"};

static int
is_qmp(const struct vm *v)
{
    return strcmp(v->ops->name, "qmp") == 0;
}

/* The QOM type inside "child<TYPE>", or NULL for a property that is not
 * a child. */
static const char *
child_type(const char *t, char *buf, size_t len)
{
    size_t n;

    if (!t || strncmp(t, "child<", 6) != 0)
        return NULL;
    snprintf(buf, len, "%s", t + 6);
    n = strlen(buf);
    if (n > 0 && buf[n - 1] == '>')
        buf[n - 1] = '\0';
    return buf;
}

/* Adds netdev to the VM's NIC backends (once each). */
static int
add_netdev(char netdevs[][64], int *n, const char *netdev)
{
    for (int i = 0; i < *n; i++)
        if (strcmp(netdevs[i], netdev) == 0)
            return 0;
    if (*n >= VM_MAX_NICS)
        return -1;
    snprintf(netdevs[(*n)++], 64, "%s", netdev);
    return 0;
}

/* The netdevs of v's NICs into netdevs; -1 with why when v has a device
 * the hold cannot cover, or QEMU did not answer. */
static int
find_netdevs(struct vm *v, int timeout_ms, char netdevs[][64], int *n,
             char *why, size_t len)
{
    struct qmp_err err;

    *n = 0;
    for (size_t r = 0; r < sizeof(dev_roots) / sizeof(dev_roots[0]); r++) {
        json_t *list = NULL, *e;
        size_t i;

        if (vm_qmp(v, "qom-list", json_pack("{s:s}", "path", dev_roots[r]),
                   timeout_ms, &list, &err) < 0) {
            snprintf(why, len, "its devices could not be listed: %s",
                     err.msg);
            return -1;
        }
        json_array_foreach(list, i, e) {
            const char *name = json_string_value(json_object_get(e, "name"));
            char tbuf[128], path[512];
            const char *type = child_type(json_string_value(
                json_object_get(e, "type")), tbuf, sizeof(tbuf));
            json_t *nd = NULL;

            if (!name || !type)
                continue;
            for (size_t u = 0; u < sizeof(unfilterable) /
                 sizeof(unfilterable[0]); u++)
                if (strstr(type, unfilterable[u])) {
                    snprintf(why, len, "device %s (%s) talks past QEMU's "
                             "network layer", name, type);
                    json_decref(list);
                    return -1;
                }
            snprintf(path, sizeof(path), "%s/%s", dev_roots[r], name);
            /* only NICs have a netdev property; the others refuse */
            if (vm_qmp(v, "qom-get", json_pack("{s:s,s:s}", "path", path,
                                               "property", "netdev"),
                       timeout_ms, &nd, &err) < 0) {
                if (err.kind != QMP_E_ERROR) {
                    snprintf(why, len, "qom-get %s: %s", path, err.msg);
                    json_decref(list);
                    return -1;
                }
                continue;
            }
            if (json_is_string(nd) && json_string_length(nd) > 0 &&
                add_netdev(netdevs, n, json_string_value(nd)) < 0) {
                snprintf(why, len, "more than %d NICs", VM_MAX_NICS);
                json_decref(nd);
                json_decref(list);
                return -1;
            }
            json_decref(nd);
        }
        json_decref(list);
    }
    return 0;
}

static int
set_status(struct vm *v, const char *id, const char *status, int timeout_ms,
           struct qmp_err *err)
{
    char path[160];

    snprintf(path, sizeof(path), "/objects/%s", id);
    return vm_qmp(v, "qom-set", json_pack("{s:s,s:s,s:s}", "path", path,
                                          "property", "status", "value",
                                          status), timeout_ms, NULL, err);
}

/* The filter on netdev, off; one made by an earlier run of the agent is
 * taken over (and turned off: nothing is cut now). */
static int
add_filter(struct vm *v, const char *netdev, const char *id, int timeout_ms,
           char *why, size_t len)
{
    struct qmp_err err;
    json_t *args = json_pack("{s:s,s:s,s:s,s:s,s:I,s:s}", "qom-type",
                             "filter-buffer", "id", id, "netdev", netdev,
                             "queue", "rx", "interval",
                             (json_int_t)4294967295LL, "status", "off");

    if (vm_qmp(v, "object-add", args, timeout_ms, NULL, &err) == 0)
        return 0;
    if (err.kind == QMP_E_ERROR &&
        set_status(v, id, "off", timeout_ms, &err) == 0)
        return 0;       /* it was there */
    snprintf(why, len, "netdev %s cannot be held: %s", netdev, err.msg);
    return -1;
}

int
hold_ready(struct vm *v, int timeout_ms, char *why, size_t len)
{
    char netdevs[VM_MAX_NICS][64];
    int n = 0;

    if (v->hold_state == 1)
        return 1;
    if (v->hold_state < 0 && mono_ms() - v->hold_at < VM_HOLD_TTL_MS) {
        snprintf(why, len, "%s", v->hold_why);
        return 0;
    }
    v->hold_at = mono_ms();
    v->nhold = 0;
    if (!is_qmp(v)) {
        snprintf(v->hold_why, sizeof(v->hold_why), "driver %s",
                 v->ops->name);
        goto unusable;
    }
    if (find_netdevs(v, timeout_ms, netdevs, &n, v->hold_why,
                     sizeof(v->hold_why)) < 0)
        goto unusable;
    for (int i = 0; i < n; i++) {
        snprintf(v->hold_id[i], sizeof(v->hold_id[i]), HOLD_ID_PREFIX "%s",
                 netdevs[i]);
        if (add_filter(v, netdevs[i], v->hold_id[i], timeout_ms,
                       v->hold_why, sizeof(v->hold_why)) < 0)
            goto unusable;
        v->nhold = i + 1;
    }
    v->hold_state = 1;
    log_info("event=hold_ready vm=%s filters=%d", v->cfg->name, v->nhold);
    return 1;
unusable:
    v->hold_state = -1;
    log_warnx("event=hold_unusable vm=%s why=\"%s\"", v->cfg->name,
              v->hold_why);
    snprintf(why, len, "%s", v->hold_why);
    return 0;
}

int
hold_on(struct vm *v, int timeout_ms, struct qmp_err *err)
{
    for (int i = 0; i < v->nhold; i++) {
        if (set_status(v, v->hold_id[i], "on", timeout_ms, err) == 0)
            continue;
        if (err->kind == QMP_E_ERROR) {
            struct qmp_err e2;

            /* refused (its QEMU is new, say): turn back off what is on;
             * the next prepare looks at the VM again */
            v->hold_state = 0;
            for (int k = 0; k < i; k++)
                if (set_status(v, v->hold_id[k], "off", timeout_ms,
                               &e2) < 0) {
                    *err = e2;      /* not answered: one may stay on */
                    return -1;
                }
        }
        return -1;
    }
    return 0;
}

/* The ids of the filters under /objects (an earlier run's). */
static int
find_filters(struct vm *v, int timeout_ms, char ids[][96], int *n,
             struct qmp_err *err)
{
    json_t *list = NULL, *e;
    size_t i;

    *n = 0;
    if (vm_qmp(v, "qom-list", json_pack("{s:s}", "path", "/objects"),
               timeout_ms, &list, err) < 0)
        return -1;
    json_array_foreach(list, i, e) {
        const char *name = json_string_value(json_object_get(e, "name"));

        if (name && strncmp(name, HOLD_ID_PREFIX,
                            strlen(HOLD_ID_PREFIX)) == 0 &&
            *n < VM_MAX_NICS)
            snprintf(ids[(*n)++], 96, "%s", name);
    }
    json_decref(list);
    return 0;
}

int
hold_off(struct vm *v, int timeout_ms, struct qmp_err *err)
{
    char found[VM_MAX_NICS][96];
    char (*ids)[96] = v->hold_id;
    int n = v->nhold;

    if (!is_qmp(v))
        return 0;
    /* this run has not made them (a restart's recovery, or its retry):
     * they are found by name */
    if (v->hold_state != 1) {
        if (find_filters(v, timeout_ms, found, &n, err) < 0)
            return err->kind == QMP_E_IO ? 0 : -1;  /* no QEMU: none on */
        ids = found;
    }
    for (int i = 0; i < n; i++)
        if (set_status(v, ids[i], "off", timeout_ms, err) < 0) {
            if (err->kind == QMP_E_ERROR) {
                /* gone with its QEMU: nothing holds; look again next time */
                v->hold_state = 0;
                continue;
            }
            return -1;
        }
    return 0;
}
