/*
 * cmd_vm: starting and stopping VMs (agent-protocol §4.9): vm.start of a
 * configured VM (its driver's start: for qmp, the `start =` command; for
 * libvirt, the domain, defined first from the config's `xml =` file when
 * there is one), and vm.stop.  A definition from the wire (spec.xml) goes
 * to cmd_vmdef.c, which starts it only when the control plane signed it:
 * a libvirt domain XML can name any disk, device or emulator of the host,
 * so whoever may send one unsigned would be root here.
 */
#include "cmd.h"

#include <string.h>

#include "log.h"
#include "mono.h"
#include "redirect.h"

/* A stop is not inside any pause, so it gets the time a QEMU may need to
 * exit rather than qmp_timeout_ms (the cut's deadline): virDomainDestroy
 * sends SIGTERM and waits up to 10 s before SIGKILL, and a loaded host can
 * take seconds for either; measured over 2 s under CI load. */
#define STOP_TIMEOUT_MS 15000

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

/*
 * vm.start of a configured VM (agent-protocol §4.9):
 *
 *   state running/paused ─────────────────────────► reply, nothing run
 *   state unknown (QMP or libvirt hung) ──────────► BUSY, nothing run
 *   shutoff ─► the driver's start (qmp: run `start =`, then query-status
 *              until "running"; libvirt: define from `xml =`, then
 *              virDomainCreate; deadline start_timeout_ms) ─► open
 *              deferred rbd disks ─► reply
 *
 * v->starting (under a.mu) makes a second concurrent vm.start of the VM,
 * or a prepare, BUSY.
 */
static json_t *
vm_start_cmd(struct agent *a, struct vm *v, const char **code, char *msg,
             size_t msglen)
{
    const struct cfg_vm *m = v->cfg;
    char err[512] = "", why[512];
    struct qmp_err qe = {0};
    const char *st;
    double t0 = mono_ms(), end = t0 + m->start_timeout_ms, cmd_ms = 0;
    json_t *r = NULL;
    int claimed = 0;

    if (!vm_startable(v, why, sizeof(why)))
        FAIL("BAD_REQUEST", "%s", why);
    pthread_mutex_lock(&a->mu);
    if (v->starting) {
        pthread_mutex_unlock(&a->mu);
        FAIL("BUSY", "vm %s: a vm.start is already running", m->name);
    }
    v->starting = claimed = 1;
    pthread_mutex_unlock(&a->mu);

    /* Never a second QEMU on the same disks: a VM that answers is left. */
    st = vm_state(v, a->cfg.qmp_timeout_ms);
    if (strcmp(st, "running") == 0 || strcmp(st, "paused") == 0) {
        log_info("event=vm_start vm=%s result=already_%s", m->name, st);
        r = json_pack("{s:s,s:s,s:f,s:b}", "vm", m->name, "state", st,
                      "start_ms", 0.0, "already_running", 1);
        goto cleanup;
    }
    if (strcmp(st, "unknown") == 0)
        FAIL("BUSY", "vm %s: its state is unknown (%s does not answer); "
             "not starting a second QEMU", m->name, m->qmp[0] ? m->qmp :
             "libvirt");
    if (v->ops->start(v, end, &cmd_ms, &qe) < 0)
        FAIL(vm_err_code(&qe), "%s", qe.msg);
    if (v->images_deferred) {
        if (agent_open_images(a, v, err, sizeof(err)) < 0)
            /* Running, but no rbd snapshot of it can be taken here. */
            FAIL("SNAPSHOT_FAILED", "vm %s started, but its rbd disks cannot "
                 "be opened: %s", m->name, err);
        v->images_deferred = 0;
    }
    log_info("event=vm_start vm=%s result=started start_ms=%.3f "
             "command_ms=%.3f", m->name, mono_ms() - t0, cmd_ms);
    r = json_pack("{s:s,s:s,s:f,s:f,s:b}", "vm", m->name, "state", "running",
                  "start_ms", mono_ms() - t0, "command_ms", cmd_ms,
                  "already_running", 0);
cleanup:
    if (claimed) {
        pthread_mutex_lock(&a->mu);
        v->starting = 0;
        pthread_mutex_unlock(&a->mu);
    }
    return r;
}

json_t *
cmd_vm_start(struct agent *a, json_t *args, const char **code, char *msg,
             size_t msglen, json_t **err_result)
{
    json_t *spec = json_object_get(args, "spec");
    const char *xml = json_string_value(json_object_get(spec, "xml"));
    json_t *jname = json_object_get(spec, "vm");
    const char *name = json_string_value(jname);
    struct vm *v;

    (void)err_result;
    if (jname && !name)
        FAIL("BAD_REQUEST", "args.spec.vm must be a string");
    if (xml)    /* signed by the control plane, or refused (cmd_vmdef.c) */
        return cmd_vm_start_signed(a, spec, code, msg, msglen);
    if (!name)
        FAIL("BAD_REQUEST", "args.spec needs vm (a VM of the agent config)");
    if (!(v = agent_find_vm(a, name)) || v->cfg->discovered)
        /* a discovered domain is the host's, not this config's */
        FAIL("UNKNOWN_VM", "unknown vm %s (vm.start starts the VMs of the "
             "agent's configuration)", name);
    return vm_start_cmd(a, v, code, msg, msglen);
cleanup:
    return NULL;
}

/* A stopped VM's rbd images are closed.  Otherwise the agent's handle keeps
 * the exclusive lock its last snapshot took (librbd holds it until another
 * client asks), and whoever waits for the stopped VM to let go of its disks
 * waits for good: the planned failover's snapshot of the stopped disks
 * (an idle guest never asked for the lock back).  vm.start, or the
 * inventory tick once the VM runs again, opens them (images_deferred). */
static void
close_images(struct agent *a, struct vm *v)
{
    int n = 0;

    pthread_mutex_lock(&a->mu);
    if (v->starting) {                  /* a vm.start or an open holds it */
        pthread_mutex_unlock(&a->mu);
        return;
    }
    v->starting = 1;
    pthread_mutex_unlock(&a->mu);
    for (int d = 0; d < v->cfg->ndisks; d++)
        if (v->img[d]) {
            rbdsnap_image_free(v->img[d]);
            v->img[d] = NULL;
            n++;
        }
    pthread_mutex_lock(&a->mu);
    v->starting = 0;
    if (n)
        v->images_deferred = 1;
    pthread_mutex_unlock(&a->mu);
    if (n)
        log_info("event=rbd_close vm=%s images=%d why=stopped", v->cfg->name, n);
}

json_t *
cmd_vm_stop(struct agent *a, json_t *args, const char **code, char *msg,
            size_t msglen, json_t **err_result)
{
    const char *name = json_string_value(json_object_get(args, "vm"));
    struct qmp_err qe;
    struct vm *v;

    (void)err_result;
    if (!(v = agent_find_vm(a, name)))
        FAIL("UNKNOWN_VM", "unknown vm %s", name);
    /* The redirect cut's overlays go while QEMU runs (redirect.h). */
    redirect_vm_stopping(a, v, "vm_stop");
    if (vm_poweroff(v, STOP_TIMEOUT_MS, &qe) < 0)
        FAIL(vm_err_code(&qe), "%s", qe.msg);
    close_images(a, v);
    log_info("event=vm_stop vm=%s", name);
    return json_pack("{s:s,s:s}", "vm", name, "state", "shutoff");
cleanup:
    return NULL;
}
