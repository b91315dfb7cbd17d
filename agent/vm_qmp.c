/*
 * vm_qmp: the "qmp" VM driver (vm.h): QEMU over the VM's QMP UNIX socket
 * (qmp.c), for VMs the agent is told about or starts itself.  Its per-VM
 * state is the QMP client; QMP events are logged.  vm.start runs the VM's
 * configured `start =` command (runcmd.c), then waits for QMP "running".
 */
#include "vm.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>

#include "guest_qga.h"
#include "log.h"
#include "mono.h"
#include "runcmd.h"

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#define QMP_CONN(v) ((struct qmp_conn *)(v)->priv)

static int
qmp_config_check(const struct agent_config *cfg, struct cfg_vm *m,
                 const char *path, char *err, size_t errlen)
{
    (void)cfg;
    if (!m->qmp[0]) {
        snprintf(err, errlen, "%s: [vm %s] needs qmp = SOCKET", path,
                 m->name);
        return -1;
    }
    if (m->xml[0] || m->mountpoints[0] || m->domain[0]) {
        snprintf(err, errlen, "%s: [vm %s] domain, xml and mountpoints are "
                 "for the libvirt driver", path, m->name);
        return -1;
    }
    return 0;
}

static int
qmp_startable(const struct vm *v, char *why, size_t len)
{
    if (v->cfg->start[0])
        return 1;
    snprintf(why, len, "vm %s has no start command in the agent config "
             "([vm %s] start = ...)", v->cfg->name, v->cfg->name);
    return 0;
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

static int
qmp_vm_open(struct vm *v, void *conn)
{
    struct qmp_conn *q = qmp_new(v->cfg->qmp);

    (void)conn;
    if (!q)
        return -1;
    qmp_set_event_cb(q, on_qmp_event, v);
    v->priv = q;
    return 0;
}

static void
qmp_vm_close(struct vm *v)
{
    qmp_free(QMP_CONN(v));
    v->priv = NULL;
}

static int
qmp_present(const struct vm *v)
{
    struct stat st;

    return stat(v->cfg->qmp, &st) == 0 && S_ISSOCK(st.st_mode);
}

static int
qmp_vm_qmp(struct vm *v, const char *cmd, json_t *args, int timeout_ms,
           json_t **ret, struct qmp_err *err)
{
    int rc;

    if (vm_lock(v, timeout_ms, err, cmd) < 0) {
        json_decref(args);
        return -1;
    }
    rc = qmp_call(QMP_CONN(v), cmd, args, timeout_ms, ret, err);
    vm_unlock(v);
    return rc;
}

/* Connecting is greeting + qmp_capabilities; query-status proves it. */
static int
qmp_connect(struct vm *v, int timeout_ms, struct qmp_err *err)
{
    return qmp_vm_qmp(v, "query-status", NULL, timeout_ms, NULL, err);
}

static int
qmp_pause(struct vm *v, int timeout_ms, struct qmp_err *err)
{
    return qmp_vm_qmp(v, "stop", NULL, timeout_ms, NULL, err);
}

static int
qmp_pause_then(struct vm *v, const char *cmd, json_t *args, int timeout_ms,
               double *t_paused, int *which, struct qmp_err *err)
{
    int rc;

    *which = 1;
    if (vm_lock(v, timeout_ms, err, "stop") < 0) {
        *t_paused = mono_ms();
        json_decref(args);
        return -1;
    }
    rc = qmp_call_pair(QMP_CONN(v), "stop", NULL, cmd, args, timeout_ms,
                       t_paused, which, err);
    vm_unlock(v);
    return rc;
}

static int
qmp_resume(struct vm *v, int timeout_ms, struct qmp_err *err)
{
    return qmp_vm_qmp(v, "cont", NULL, timeout_ms, NULL, err);
}

static const char *
qmp_state(struct vm *v, int timeout_ms)
{
    struct qmp_err err;
    json_t *ret = NULL;
    const char *s = "unknown";

    if (qmp_vm_qmp(v, "query-status", NULL, timeout_ms, &ret, &err) < 0)
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

static int
qmp_poweroff(struct vm *v, int timeout_ms, struct qmp_err *err)
{
    int rc = qmp_vm_qmp(v, "quit", NULL, timeout_ms, NULL, err);

    if (rc < 0 && err->kind == QMP_E_IO)
        rc = 0;     /* QEMU may close before replying */
    return rc;
}

/* Output of a failed start command for an error message: one line. */
static const char *
flat(char *s)
{
    for (char *p = s; *p; p++)
        if (*p == '\n' || *p == '\r' || *p == '"')
            *p = *p == '"' ? '\'' : ' ';
    return s[0] ? s : "(no output)";
}

static int
start_fail(struct qmp_err *err, enum qmp_errkind kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int
start_fail(struct qmp_err *err, enum qmp_errkind kind, const char *fmt, ...)
{
    va_list ap;

    err->kind = kind;
    err->cls[0] = '\0';
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    va_end(ap);
    return -1;
}

/*
 * vm.start (agent-protocol §4.9): run `start =` (deadline) ─► exit 0 ─►
 * query-status until "running" (same deadline).  Only the configured
 * command of a configured VM ever runs; the request names the VM, never a
 * program or an argument.
 */
static int
qmp_start(struct vm *v, double deadline, double *cmd_ms, struct qmp_err *err)
{
    const struct cfg_vm *m = v->cfg;
    char buf[sizeof(m->start)], *argv[RUNCMD_MAX_ARGS], rerr[512] = "";
    struct runcmd_result sr;
    struct qmp_err qe = {0};
    json_t *ret = NULL;

    *cmd_ms = 0;
    runcmd_split(m->start, buf, sizeof(buf), argv, RUNCMD_MAX_ARGS);
    log_info("event=vm_start_begin vm=%s command=\"%s\" timeout_ms=%d",
             m->name, argv[0], m->start_timeout_ms);
    if (runcmd_run(argv, m->start_timeout_ms, &sr, rerr, sizeof(rerr)) < 0) {
        log_warnx("event=vm_start_failed vm=%s msg=\"%s\"", m->name, rerr);
        return start_fail(err, QMP_E_ERROR, "vm %s: start command: %s",
                          m->name, rerr);
    }
    *cmd_ms = sr.ms;
    if (sr.timed_out) {
        log_warnx("event=vm_start_failed vm=%s why=timeout command_ms=%.3f",
                  m->name, *cmd_ms);
        return start_fail(err, QMP_E_TIMEOUT, "vm %s: start command %s did "
                          "not exit within %d ms (killed); output: %s",
                          m->name, argv[0], m->start_timeout_ms,
                          flat(sr.out));
    }
    if (!runcmd_ok(&sr)) {
        log_warnx("event=vm_start_failed vm=%s exit=%d signal=%d "
                  "command_ms=%.3f", m->name, sr.exit_code, sr.signo,
                  *cmd_ms);
        if (sr.signo)
            return start_fail(err, QMP_E_ERROR, "vm %s: start command %s "
                              "killed by signal %d; output: %s", m->name,
                              argv[0], sr.signo, flat(sr.out));
        return start_fail(err, QMP_E_ERROR, "vm %s: start command %s exited "
                          "with %d; output: %s", m->name, argv[0],
                          sr.exit_code, flat(sr.out));
    }
    /* The command returned; the VM counts as started once its QMP says
     * running (a launcher may return before QEMU listens). */
    for (;;) {
        double left = deadline - mono_ms();
        int rc;

        if (left <= 0) {
            log_warnx("event=vm_start_failed vm=%s why=not_running "
                      "msg=\"%s\"", m->name, qe.msg);
            return start_fail(err, QMP_E_TIMEOUT, "vm %s: start command %s "
                              "exited 0 but %s did not report running "
                              "within %d ms (last: %s)", m->name, argv[0],
                              m->qmp, m->start_timeout_ms,
                              qe.msg[0] ? qe.msg : "not running");
        }
        rc = qmp_vm_qmp(v, "query-status", NULL, left < 1000 ?
                        (int)left + 1 : 1000, &ret, &qe);
        if (rc == 0 && json_is_true(json_object_get(ret, "running")))
            break;
        if (rc == 0)
            snprintf(qe.msg, sizeof(qe.msg), "status %s",
                     json_string_value(json_object_get(ret, "status")) ?: "?");
        json_decref(ret);
        ret = NULL;
        {
            struct timespec ts = {0, 50 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    json_decref(ret);
    return 0;
}

const struct vm_ops vm_qmp_ops = {
    .name = "qmp",
    .config_check = qmp_config_check,
    .open = qmp_vm_open,
    .close = qmp_vm_close,
    .present = qmp_present,
    .startable = qmp_startable,
    .connect = qmp_connect,
    .pause = qmp_pause,
    .pause_then = qmp_pause_then,
    .resume = qmp_resume,
    .state = qmp_state,
    .qmp = qmp_vm_qmp,
    .poweroff = qmp_poweroff,
    .start = qmp_start,
    .guest_configured = guest_qga_configured,
    .guest_open = guest_qga_open,
    .guest_freeze = guest_qga_freeze,
    .guest_thaw = guest_qga_thaw,
    .guest_close = guest_qga_close,
    .guest_command = guest_qga_command,
};
