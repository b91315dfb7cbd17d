/* guest_libvirt: see guest_libvirt.h. */
#include "guest_libvirt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libvirt/virterror.h>

#include "lvdomain.h"

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#define THAW_TIMEOUT_MS 6000

/* The channel: the VM whose domain's guest agent libvirt talks to. */
struct guest_lv {
    struct vm *v;
};

#define GLV(g) ((struct guest_lv *)(void *)(g))

/* Without a fresh cache: yes, so that prepare journals a `frozen` entry
 * (a thaw of a guest that was not frozen is harmless). */
int
guest_libvirt_configured(const struct vm *v)
{
    struct lvdom *d = malloc(sizeof(*d));
    int up, rc = 1;

    if (d && lvdomain_cached(v, d, &up) == 0 && up && d->have_xml)
        rc = d->xml.guest_agent;
    free(d);
    return rc;
}

int
guest_libvirt_open(const struct vm *v, struct vm_guest **out, char *err,
                   size_t errlen)
{
    struct lvdom *d = malloc(sizeof(*d));
    int up = 0, known = d && lvdomain_cached(v, d, &up) == 0;
    int channel = known && d->have_xml ? d->xml.guest_agent : 1;
    struct guest_lv *g;

    free(d);
    if (!up || !channel) {
        snprintf(err, errlen, "vm %s: %s", v->cfg->name, !up ?
                 "not connected to libvirt" : "its domain has no guest "
                 "agent channel (org.qemu.guest_agent.0)");
        return -1;
    }
    if (!(g = calloc(1, sizeof(*g)))) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    g->v = (struct vm *)v;
    *out = (struct vm_guest *)(void *)g;
    return 0;
}

/* libvirt refused the freeze before sending it to the guest agent, or it
 * was never sent. */
static int
freeze_unsent(const struct lvcall_err *le)
{
    if (le->kind == LVCALL_BUSY)
        return 1;
    return le->kind == LVCALL_REFUSED &&
           (le->code == VIR_ERR_NO_CONNECT ||
            le->code == VIR_ERR_ARGUMENT_UNSUPPORTED ||
            le->code == VIR_ERR_OPERATION_INVALID ||
            le->code == VIR_ERR_NO_SUPPORT ||
            (le->code == VIR_ERR_AGENT_UNRESPONSIVE &&
             strstr(le->msg, "not connected")));
}

int
guest_libvirt_freeze(struct vm_guest *g, int timeout_ms, int *nfs, char *err,
                     size_t errlen)
{
    struct vm *v = GLV(g)->v;
    struct lvdomain_call a = {.op = LVOP_FREEZE};
    struct lvcall_err le;

    snprintf(a.mounts, sizeof(a.mounts), "%s", v->cfg->mountpoints);
    if (lvdomain_run(v, &LV_PRIV(v)->guest_slot, &a, timeout_ms, &le) < 0) {
        snprintf(err, errlen, "%s", le.msg);
        return freeze_unsent(&le) ? VM_GUEST_UNSENT : -1;
    }
    *nfs = a.ret;
    return 0;
}

int
guest_libvirt_thaw(struct vm_guest *g, int *nfs, char *err, size_t errlen)
{
    struct vm *v = GLV(g)->v;
    struct lvdomain_call a = {.op = LVOP_THAW};
    struct lvcall_err le;

    if (lvdomain_run(v, &LV_PRIV(v)->guest_slot, &a, THAW_TIMEOUT_MS,
                     &le) < 0) {
        snprintf(err, errlen, "%s", le.msg);
        return -1;
    }
    *nfs = a.ret;
    return 0;
}

void
guest_libvirt_close(struct vm_guest *g)
{
    free(GLV(g));
}

int
guest_libvirt_command(struct vm *v, const char *cmd, json_t *args,
                      int timeout_ms, json_t **ret, struct qmp_err *err)
{
    struct lvdomain_call a = {.op = LVOP_AGENT};
    json_t *req = json_pack("{s:s}", "execute", cmd), *m = NULL, *e;
    struct lvcall_err le = {0};
    int rc = -1, run = -1;

    *ret = NULL;
    err->kind = QMP_E_ERROR;
    err->cls[0] = '\0';
    if (req && args)
        json_object_set_new(req, "arguments", args);
    else
        json_decref(args);
    if (!req || !(a.in = json_dumps(req, JSON_COMPACT))) {
        snprintf(err->msg, sizeof(err->msg), "%s: out of memory", cmd);
        goto cleanup;
    }
    /* libvirt's wait a little inside ours, so that its own "not
     * responding" comes back before lvcall abandons the call */
    a.wait_s = timeout_ms > 2000 ? (timeout_ms - 1000) / 1000 : 1;
    if ((run = lvdomain_run(v, &LV_PRIV(v)->guest_slot, &a, timeout_ms,
                            &le)) < 0) {
        snprintf(err->msg, sizeof(err->msg), "%s: %s", cmd, le.msg);
        if (le.kind == LVCALL_TIMEOUT ||
            (le.code == VIR_ERR_AGENT_UNRESPONSIVE &&
             !strstr(le.msg, "not connected")))
            err->kind = QMP_E_TIMEOUT;
        goto cleanup;
    }
    m = json_loads(a.out ? a.out : "", 0, NULL);
    if ((e = json_object_get(m, "error"))) {
        const char *d = json_string_value(json_object_get(e, "desc"));
        snprintf(err->msg, sizeof(err->msg), "%s: %s", cmd, d ? d : "error");
        goto cleanup;
    }
    if (!(*ret = json_incref(json_object_get(m, "return")))) {
        snprintf(err->msg, sizeof(err->msg), "%s: the guest agent's reply "
                 "has neither return nor error", cmd);
        goto cleanup;
    }
    rc = 0;
cleanup:
    lvdomain_call_done(&a, &le, run);
    json_decref(m);
    json_decref(req);
    return rc;
}
