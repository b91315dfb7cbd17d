/*
 * vm_libvirt: the "libvirt" VM driver (vm.h), for libvirt-managed domains,
 * through libvirt's native API only, so that libvirt never marks a domain
 * tainted (custom-monitor) on cutpoint's account.
 *
 *   connection  lvconn.c: one connection with keepalive, reconnected with
 *               backoff; domain lifecycle events keep a cache of the
 *               domains (the live inventory; discovery adds them as VMs)
 *   pause/resume/state/poweroff
 *               virDomainSuspend / virDomainResume / virDomainGetState /
 *               virDomainDestroy
 *   start       virDomainDefineXML of the config's `xml =` (if any), then
 *               virDomainCreate; a definition the control plane signed
 *               (lvstart.c, defsig.c): define_start
 *   definition  virDomainGetXMLDesc(VIR_DOMAIN_XML_INACTIVE), for DR
 *   guest       virDomainFSFreeze / virDomainFSThaw (libvirt's own guest
 *               agent channel; [vm] mountpoints)
 *   disks       target dev and source (pool/image, file) from the domain
 *               XML (domxml.c); snapshots through librbd (storage/)
 *   qmp         raw QMP through virDomainQemuMonitorCommand, only with
 *               [libvirt] qmp_passthrough = yes (it taints the domain): the
 *               qmp-transaction method for qcow2 disks
 *
 * Every libvirt call runs through lvcall.c with a deadline (lvdomain.c):
 * a stopped libvirtd or a hung QEMU fails the call in time instead of
 * holding a prepare.  The driver's files, each with its own concept:
 *   vm_libvirt.c     this table: the connection and VM ops
 *   lvdef.c          config checks, discovery, disks, `xml =` files
 *   lvstart.c        define and start a signed definition
 *   lvconn.c         the connection; lvcache.c the domains it knows
 *   lvdomain.c       one call on one domain; lvcall.c the deadline
 *   guest_libvirt.c  the guest ops;  domxml.c the domain XML
 * They are the only files of the agent that call libvirt.
 */
#include "vm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>

#include "domxml.h"
#include "guest_libvirt.h"
#include "lvdef.h"
#include "log.h"
#include "lvdomain.h"
#include "mono.h"

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#define SET(dst, v) snprintf((dst), sizeof(dst), "%s", (v))
/* The manager's calls (listing, XML) are not in any pause window. */
#define CONN_CALL_TIMEOUT_MS 10000
/* A suspend whose request may sit unread in a stopped libvirtd's socket
 * can still land after the connection dropped.  Once a new connection has
 * been up this long, libvirtd has read what it had buffered. */
#define SETTLE_MS 2000.0

/* ---- the connection ------------------------------------------------------ */

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
    struct lv_host *h;

    virSetErrorFunc(NULL, quiet_libvirt);
    if (!cfg->libvirt_uri[0])
        return 0;
    if (!(h = calloc(1, sizeof(*h))) ||
        !(h->c = lvconn_new(cfg->libvirt_uri, CONN_CALL_TIMEOUT_MS))) {
        free(h);
        snprintf(err, errlen, "libvirt %s: cannot start its connection "
                 "thread", cfg->libvirt_uri);
        return -1;
    }
    h->passthrough = cfg->libvirt_qmp_passthrough;
    h->cfg = cfg;
    *conn = h;
    return 0;
}

static void
lv_conn_close(void *conn)
{
    struct lv_host *h = conn;

    lvconn_free(h->c);
    free(h);
}

static int
lv_may_discover(const struct agent_config *cfg)
{
    return cfg->libvirt_uri[0] && cfg->libvirt_discover;
}

static int
lv_conn_ready(void *conn, char *err, size_t errlen)
{
    return lvconn_ready(((struct lv_host *)conn)->c, err, errlen);
}

static void
lv_conn_watch(void *conn, void (*fn)(void *), void *opaque)
{
    lvconn_watch(((struct lv_host *)conn)->c, fn, opaque);
}

static void
lv_conn_describe(void *conn, json_t *o)
{
    struct lvconn_status st;

    lvconn_status(((struct lv_host *)conn)->c, &st);
    json_object_set_new(o, "connected", json_boolean(st.connected));
    json_object_set_new(o, "epoch", json_integer(st.epoch));
    json_object_set_new(o, "events", json_integer(st.events));
    json_object_set_new(o, "since_ms", json_real(mono_ms() - st.since));
    json_object_set_new(o, "error", st.connected ? json_null() :
                        json_string(st.error));
}

/* ---- one VM ------------------------------------------------------------ */

static int
lv_open(struct vm *v, void *conn)
{
    struct lv_vm *p = LV_PRIV(v);

    if (!p) {
        if (!(p = calloc(1, sizeof(*p))))
            return -1;
        lvcall_slot_init(&p->vm_slot);
        lvcall_slot_init(&p->guest_slot);
        pthread_mutex_init(&p->mu, NULL);
        v->priv = p;
    }
    if (conn)
        p->h = conn;
    return 0;
}

static void
lv_close(struct vm *v)
{
    struct lv_vm *p = LV_PRIV(v);

    /* Kept while a worker still uses its slots (a hung call): freeing it
     * under the worker would be worse than the leak. */
    if (!p || lvcall_slot_busy(&p->vm_slot) ||
        lvcall_slot_busy(&p->guest_slot))
        return;
    pthread_mutex_destroy(&p->mu);
    free(p);
    v->priv = NULL;
}

static int
lv_present(const struct vm *v)
{
    struct lvdom *d = malloc(sizeof(*d));
    int up, rc = d && lvdomain_cached(v, d, &up) == 0 && d->active;

    free(d);
    return rc;
}

static int
lv_startable(const struct vm *v, char *why, size_t len)
{
    (void)v, (void)why, (void)len;
    return 1;       /* a defined domain, or its `xml =` (lv_start says) */
}

static int
lv_describe(struct vm *v, json_t *o)
{
    struct lvdom *d = malloc(sizeof(*d));
    struct lv_vm *p = LV_PRIV(v);
    json_t *un;
    int up, known = d && lvdomain_cached(v, d, &up) == 0;

    if (!d)
        return 0;
    if (v->cfg->discovered &&
        ((!known && up) || (known && d->have_xml && p && p->h &&
                            !config_libvirt_manages(p->h->cfg, d->name,
                                                    d->xml.managed)))) {
        free(d);
        return 1;           /* its domain went away, or is no longer ours */
    }
    json_object_set_new(o, "state", json_string(
        known ? lvcache_state_name(d->state) : up ? "shutoff" : "unknown"));
    json_object_set_new(o, "stale", json_boolean(!up));
    json_object_set_new(o, "domain", json_string(v->cfg->domain));
    json_object_set_new(o, "uuid", known && d->uuid[0] ?
                        json_string(d->uuid) : json_null());
    json_object_set_new(o, "defined", json_boolean(known));
    if (known && d->have_xml) {
        json_object_set_new(o, "guest_agent",
                            json_boolean(d->xml.guest_agent));
        un = json_array();
        for (int i = 0; i < d->xml.nunsupported; i++)
            json_array_append_new(un, json_pack(
                "{s:s,s:s}", "target", d->xml.unsupported[i].target,
                "why", d->xml.unsupported[i].why));
        json_object_set_new(o, "unsupported_disks", un);
    }
    free(d);
    return 0;
}

static int
lv_snap_check(const struct vm *v, char *err, size_t errlen)
{
    struct lv_vm *p = LV_PRIV(v);

    if (v->cfg->ndisks == 0 || v->snap != &snap_qmp_ops ||
        (p && p->h && p->h->passthrough))
        return 0;
    snprintf(err, errlen, "vm %s: its disks need the qmp-transaction method, "
             "which for a libvirt domain needs [libvirt] qmp_passthrough = "
             "yes (it marks the domain tainted)", v->cfg->name);
    return -1;
}

/* libvirt's block node of disk d: libvirt-<source index>-format (its
 * -blockdev naming); the config's name when the index is unknown. */
static const char *
lv_monitor_node(struct vm *v, int d)
{
    struct lv_vm *p = LV_PRIV(v);
    struct lvdom *dom = malloc(sizeof(*dom));
    const char *target = v->cfg->disks[d].node, *node = target;
    int up;

    if (p && dom && lvdomain_cached(v, dom, &up) == 0 && dom->have_xml)
        for (int i = 0; i < dom->xml.ndisks; i++)
            if (strcmp(dom->xml.disks[i].node, target) == 0 &&
                dom->xml.index[i] >= 0) {
                pthread_mutex_lock(&p->mu);
                snprintf(p->node[d], sizeof(p->node[d]), "libvirt-%d-format",
                         dom->xml.index[i]);
                pthread_mutex_unlock(&p->mu);
                node = p->node[d];
            }
    free(dom);
    return node;
}

static void
mark_unsettled(struct vm *v, const struct lvcall_err *le)
{
    struct lv_vm *p = LV_PRIV(v);
    long epoch;
    virConnectPtr c;

    if ((le->kind != LVCALL_TIMEOUT && le->kind != LVCALL_TRANSPORT) ||
        !p->h)
        return;
    if ((c = lvconn_get(p->h->c, &epoch)))
        virConnectClose(c);
    pthread_mutex_lock(&p->mu);
    p->unsettled = 1;
    p->unsettled_epoch = epoch;
    p->unsettled_seq = le->seq;
    pthread_mutex_unlock(&p->mu);
}

static int
lv_pause(struct vm *v, int timeout_ms, struct qmp_err *err)
{
    struct lvdomain_call a = {.op = LVOP_SUSPEND};
    struct lvcall_err le;
    int rc = lvdomain_run_locked(v, &a, timeout_ms, &le, err);

    if (rc < 0)
        mark_unsettled(v, &le);
    return rc;
}

/*
 * 1 while a suspend that failed without an answer may still land: its
 * call still runs, or it was lost with its connection and the next
 * connection has not been up for SETTLE_MS.  A resume before then could
 * be overtaken by it, leaving the VM paused.
 */
static int
still_unsettled(struct vm *v)
{
    struct lv_vm *p = LV_PRIV(v);
    struct lvconn_status st;
    int un;

    unsigned long seq;

    pthread_mutex_lock(&p->mu);
    un = p->unsettled;
    seq = p->unsettled_seq;
    pthread_mutex_unlock(&p->mu);
    if (!un)
        return 0;
    if (lvcall_slot_busy(&p->vm_slot))
        return 1;
    pthread_mutex_lock(&p->vm_slot.mu);
    /* that suspend came back late with libvirt's own answer */
    un = !(p->vm_slot.late.seq == seq &&
           p->vm_slot.late.kind != LVCALL_TRANSPORT);
    pthread_mutex_unlock(&p->vm_slot.mu);
    lvconn_status(p->h->c, &st);
    if (un && !(st.connected && st.epoch > p->unsettled_epoch &&
                mono_ms() - st.since >= SETTLE_MS))
        return 1;
    pthread_mutex_lock(&p->mu);
    p->unsettled = 0;
    pthread_mutex_unlock(&p->mu);
    return 0;
}

static int
lv_resume(struct vm *v, int timeout_ms, struct qmp_err *err)
{
    struct lvdomain_call a = {.op = LVOP_RESUME};
    struct lvcall_err le;

    if (lvdomain_run_locked(v, &a, timeout_ms, &le, err) < 0)
        return -1;
    if (LV_PRIV(v)->h && still_unsettled(v)) {
        err->kind = QMP_E_IO;
        err->cls[0] = '\0';
        snprintf(err->msg, sizeof(err->msg), "vm %s: resumed, but a "
                 "virDomainSuspend that got no answer may still land; "
                 "checking again", v->cfg->name);
        return -1;
    }
    return 0;
}

static const char *
lv_state(struct vm *v, int timeout_ms)
{
    struct lvdomain_call a = {.op = LVOP_STATE};
    struct lvcall_err le;
    struct qmp_err err;

    if (lvdomain_run_locked(v, &a, timeout_ms, &le, &err) < 0)
        return a.not_found ? "shutoff" : "unknown";
    return lvcache_state_name(a.state);
}

static int
lv_poweroff(struct vm *v, int timeout_ms, struct qmp_err *err)
{
    struct lvdomain_call a = {.op = LVOP_DESTROY};
    struct lvcall_err le;

    return lvdomain_run_locked(v, &a, timeout_ms, &le, err);
}

/* The `xml =` file to define (*xml, new string).  One that names no UUID
 * gets the UUID of the domain of its name, when this host has it:
 * libvirt refuses to redefine a domain under another UUID. */
static int
definition(struct vm *v, char **xml, char *err, size_t errlen)
{
    struct domxml *dx = malloc(sizeof(*dx));
    struct lvdom *d = malloc(sizeof(*d));
    int up, rc = -1;
    char *with;

    if (!dx || !d) {
        snprintf(err, errlen, "out of memory");
        goto cleanup;
    }
    if (!(*xml = lvdef_read(v->cfg, dx, err, errlen)))
        goto cleanup;
    rc = 0;
    if (dx->uuid[0] || lvdomain_cached(v, d, &up) < 0 || !d->uuid[0])
        goto cleanup;
    if (!(with = domxml_with_uuid(*xml, d->uuid, err, errlen))) {
        free(*xml);
        *xml = NULL;
        rc = -1;
        goto cleanup;
    }
    free(*xml);
    *xml = with;
cleanup:
    free(dx);
    free(d);
    return rc;
}

/*
 * vm.start (agent-protocol §4.9): with `xml =`, virDomainDefineXML of that
 * file (created, or updated to it), then virDomainCreate; without, the
 * domain must be defined here.  The request names the VM only.
 */
static int
lv_start(struct vm *v, double deadline, double *cmd_ms, struct qmp_err *err)
{
    struct lvdomain_call a = {.op = LVOP_START};
    struct lvcall_err le = {0};
    char e[300];
    double t0 = mono_ms();
    int rc = -1;

    *cmd_ms = 0;
    if (v->cfg->xml[0] && definition(v, &a.in, e, sizeof(e)) < 0) {
        err->kind = QMP_E_ERROR;
        err->cls[0] = '\0';
        snprintf(err->msg, sizeof(err->msg), "vm %s: definition: %s",
                 v->cfg->name, e);
        goto cleanup;
    }
    log_info("event=vm_start_begin vm=%s domain=%s define=%s", v->cfg->name,
             v->cfg->domain, a.in ? v->cfg->xml : "no");
    rc = lvdomain_run_locked(v, &a, (int)(deadline - mono_ms()), &le, err);
    *cmd_ms = mono_ms() - t0;
    if (rc < 0 && a.not_found)
        snprintf(err->msg, sizeof(err->msg), "vm %s: domain %s is not "
                 "defined here and [vm %s] has no xml =", v->cfg->name,
                 v->cfg->domain, v->cfg->name);
    if (rc < 0)
        log_warnx("event=vm_start_failed vm=%s msg=\"%s\"", v->cfg->name,
                  err->msg);
    if (LV_PRIV(v)->h)
        lvcache_refresh(lvconn_cache(LV_PRIV(v)->h->c), v->cfg->domain);
cleanup:
    lvdomain_call_done(&a, &le, rc);
    return rc;
}

/* vm.definition: the domain's persistent XML (virDomainGetXMLDesc with
 * VIR_DOMAIN_XML_INACTIVE: what a define recreates, not the live state). */
static int
lv_definition(struct vm *v, int timeout_ms, char **out, struct qmp_err *err)
{
    struct lvdomain_call a = {.op = LVOP_XML};
    struct lvcall_err le = {0};
    int rc = lvdomain_run_locked(v, &a, timeout_ms, &le, err);

    if (rc < 0 && a.not_found)
        snprintf(err->msg, sizeof(err->msg), "vm %s: domain %s is not "
                 "defined here", v->cfg->name, v->cfg->domain);
    *out = rc == 0 ? a.out : NULL;
    if (rc == 0)
        a.out = NULL;       /* the caller's now */
    lvdomain_call_done(&a, &le, rc);
    return rc;
}

static int
lv_qmp(struct vm *v, const char *cmd, json_t *args, int timeout_ms,
       json_t **ret, struct qmp_err *err)
{
    struct lvdomain_call a = {.op = LVOP_QMP};
    struct lvcall_err le = {0};
    json_t *req, *rep = NULL, *e;
    int rc = -1;

    if (!LV_PRIV(v)->h || !LV_PRIV(v)->h->passthrough) {
        json_decref(args);
        err->kind = QMP_E_ERROR;
        err->cls[0] = '\0';
        snprintf(err->msg, sizeof(err->msg), "%s: vm %s: raw QMP is off for "
                 "libvirt domains ([libvirt] qmp_passthrough = no)", cmd,
                 v->cfg->name);
        return -1;
    }
    req = json_pack("{s:s}", "execute", cmd);
    if (args)
        json_object_set_new(req, "arguments", args);
    a.in = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    log_debug("event=qmp_send vm=%s via=libvirt json=%s", v->cfg->name, a.in);
    if (lvdomain_run_locked(v, &a, timeout_ms, &le, err) < 0)
        goto cleanup;
    log_debug("event=qmp_recv vm=%s via=libvirt json=%s", v->cfg->name,
              a.out);
    rep = json_loads(a.out, 0, NULL);
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
    lvdomain_call_done(&a, &le, rc);
    json_decref(rep);
    return rc;
}

const struct vm_ops vm_libvirt_ops = {
    .name = "libvirt",
    .config_check = lvdef_config_check,
    .conn_open = lv_conn_open,
    .conn_close = lv_conn_close,
    .conn_ready = lv_conn_ready,
    .conn_watch = lv_conn_watch,
    .conn_describe = lv_conn_describe,
    .discover = lvdef_discover,
    .may_discover = lv_may_discover,
    .fill = lvdef_fill,
    .open = lv_open,
    .close = lv_close,
    .present = lv_present,
    .startable = lv_startable,
    .describe = lv_describe,
    .snap_check = lv_snap_check,
    .monitor_node = lv_monitor_node,
    .pause = lv_pause,
    .resume = lv_resume,
    .state = lv_state,
    .qmp = lv_qmp,
    .poweroff = lv_poweroff,
    .start = lv_start,
    .definition = lv_definition,
    .definition_format = "libvirt-domain-xml",
    .define_start = lvstart_define_start,
    .guest_configured = guest_libvirt_configured,
    .guest_open = guest_libvirt_open,
    .guest_freeze = guest_libvirt_freeze,
    .guest_thaw = guest_libvirt_thaw,
    .guest_close = guest_libvirt_close,
    .guest_command = guest_libvirt_command,
};
