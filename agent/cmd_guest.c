/*
 * cmd_guest: commands run in a VM's guest through its guest agent
 * (qemu-guest-agent), agent-protocol §4.12; the readiness rule and the
 * in-guest checks of a drill use them.
 *
 *   vm.guest_ping{vm, timeout_ms?}            guest-ping
 *   vm.guest_exec{vm, path, args?, input?, timeout_ms?}
 *
 * vm.guest_exec, one deadline (timeout_ms, default 30 s) for all of it:
 *
 *   guest-exec {path, arg, input-data, capture-output} ─► pid
 *     ─► guest-exec-status {pid} every 100 ms (doubling to 1 s)
 *          exited ─► decode out-data/err-data (base64), cap each at
 *                    GUEST_OUTPUT_MAX bytes, reply with exitcode/signal
 *          deadline ─► GUEST_TIMEOUT with {pid} (qemu-ga cannot kill it:
 *                      the process may still run in the guest)
 *
 * Each call goes through the VM's driver (vm_ops guest_command): the qmp
 * driver's `qga =` socket, or libvirt's virDomainQemuAgentCommand, which
 * marks the domain tainted (custom-ga-command).  That is why these
 * commands are separate from the cut's freeze and thaw, which use
 * libvirt's native API: they are meant for drill copies and checks.  A
 * non-zero exit is a result, not an error: the caller judges it.
 */
#include "cmd.h"

#include <string.h>
#include <time.h>
#include <openssl/evp.h>

#include "log.h"
#include "mono.h"

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#define PING_TIMEOUT_MS 5000
#define EXEC_TIMEOUT_MS 30000
/* Each stream's bytes kept in the reply: with JSON's escapes (at most 6
 * bytes per byte) two of them stay well inside a 1 MiB frame (§2.2). */
#define GUEST_OUTPUT_MAX 65536
/* One status poll's own deadline (the exec's deadline bounds the whole). */
#define STATUS_CALL_MS 5000

/* The VM of args.vm with a guest_command, or NULL with *code and msg. */
static struct vm *
guest_vm(struct agent *a, json_t *args, const char **code, char *msg,
         size_t msglen)
{
    const char *name = json_string_value(json_object_get(args, "vm"));
    struct vm *v = agent_find_vm(a, name);

    if (!v) {
        *code = "UNKNOWN_VM";
        snprintf(msg, msglen, "unknown vm %s", name);
        return NULL;
    }
    if (!v->ops->guest_command) {
        *code = "BAD_REQUEST";
        snprintf(msg, msglen, "vm %s: its driver (%s) has no guest agent "
                 "channel", name, v->ops->name);
        return NULL;
    }
    return v;
}

static const char *
guest_code(const struct qmp_err *e)
{
    return e->kind == QMP_E_TIMEOUT ? "GUEST_TIMEOUT" : "GUEST_ERROR";
}

static int
timeout_of(json_t *args, int dflt)
{
    json_t *t = json_object_get(args, "timeout_ms");

    return t ? (int)json_integer_value(t) : dflt;
}

json_t *
cmd_vm_guest_ping(struct agent *a, json_t *args, const char **code,
                  char *msg, size_t msglen, json_t **err_result)
{
    struct vm *v;
    struct qmp_err qe = {0};
    json_t *ret = NULL, *r = NULL;
    double t0 = mono_ms();

    (void)err_result;
    if (!(v = guest_vm(a, args, code, msg, msglen)))
        goto cleanup;
    if (v->ops->guest_command(v, "guest-ping", NULL,
                              timeout_of(args, PING_TIMEOUT_MS), &ret,
                              &qe) < 0)
        FAIL(guest_code(&qe), "vm %s: %s", v->cfg->name, qe.msg);
    r = json_pack("{s:s,s:f}", "vm", v->cfg->name, "ping_ms",
                  mono_ms() - t0);
cleanup:
    json_decref(ret);
    return r;
}

/* Replaces each byte that is not part of valid UTF-8 with '?', so that
 * the output is a JSON string whatever the guest printed. */
static void
utf8_clean(unsigned char *s, size_t n)
{
    size_t i = 0;

    while (i < n) {
        unsigned char c = s[i];
        size_t len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 && c >= 0xc2 ? 2 :
                     (c & 0xf0) == 0xe0 ? 3 :
                     (c & 0xf8) == 0xf0 && c <= 0xf4 ? 4 : 0;
        size_t k;

        if (len == 0 || i + len > n) {
            s[i++] = '?';
            continue;
        }
        for (k = 1; k < len && (s[i + k] & 0xc0) == 0x80; k++)
            ;
        /* overlong 3-byte, surrogates, past U+10FFFF */
        if (k == len && len == 3 &&
            ((c == 0xe0 && s[i + 1] < 0xa0) || (c == 0xed && s[i + 1] >= 0xa0)))
            k = 0;
        if (k == len && len == 4 &&
            ((c == 0xf0 && s[i + 1] < 0x90) || (c == 0xf4 && s[i + 1] >= 0x90)))
            k = 0;
        if (k != len) {
            s[i++] = '?';
            continue;
        }
        i += len;
    }
}

/*
 * Sets o[key] to the decoded base64 text b64 (may be NULL: ""), cut at
 * GUEST_OUTPUT_MAX bytes; o[key_truncated] says whether it was cut, here
 * or by qemu-ga (guest_cut).  -1 when b64 is not base64.
 */
static int
put_output(json_t *o, const char *key, const char *b64, int guest_cut)
{
    size_t n = b64 ? strlen(b64) : 0, pad = 0, len;
    unsigned char *buf = malloc(n / 4 * 3 + 3);
    char tkey[32];
    int got, cut = guest_cut, rc = -1;

    if (!buf)
        return -1;
    if (n % 4 != 0)
        goto cleanup;
    got = n ? EVP_DecodeBlock(buf, (const unsigned char *)b64, (int)n) : 0;
    if (got < 0)
        goto cleanup;
    /* EVP_DecodeBlock counts the padding as zero bytes */
    while (pad < 2 && n > pad && b64[n - 1 - pad] == '=')
        pad++;
    len = (size_t)got - pad;
    if (len > GUEST_OUTPUT_MAX) {
        len = GUEST_OUTPUT_MAX;
        cut = 1;
    }
    utf8_clean(buf, len);
    json_object_set_new(o, key, json_stringn((const char *)buf, len));
    snprintf(tkey, sizeof(tkey), "%s_truncated", key);
    json_object_set_new(o, tkey, json_boolean(cut));
    rc = 0;
cleanup:
    free(buf);
    return rc;
}

/* guest-exec's arguments from the request (new reference). */
static json_t *
exec_args(json_t *args)
{
    json_t *g = json_pack("{s:O,s:b}", "path", json_object_get(args, "path"),
                          "capture-output", 1);
    json_t *argv = json_object_get(args, "args");
    const char *input = json_string_value(json_object_get(args, "input"));

    if (g && argv)
        json_object_set(g, "arg", argv);
    if (g && input) {
        size_t n = strlen(input);
        char *b = malloc(4 * ((n + 2) / 3) + 1);

        if (!b) {
            json_decref(g);
            return NULL;
        }
        EVP_EncodeBlock((unsigned char *)b, (const unsigned char *)input,
                        (int)n);
        json_object_set_new(g, "input-data", json_string(b));
        free(b);
    }
    return g;
}

static void
sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};

    nanosleep(&ts, NULL);
}

json_t *
cmd_vm_guest_exec(struct agent *a, json_t *args, const char **code,
                  char *msg, size_t msglen, json_t **err_result)
{
    const char *path = json_string_value(json_object_get(args, "path"));
    int timeout = timeout_of(args, EXEC_TIMEOUT_MS), step = 100, left;
    double t0 = mono_ms(), deadline = t0 + timeout;
    struct qmp_err qe = {0};
    json_t *ret = NULL, *st = NULL, *r = NULL, *g;
    json_int_t pid;
    struct vm *v;

    if (!(v = guest_vm(a, args, code, msg, msglen)))
        goto cleanup;
    if (!(g = exec_args(args)))
        FAIL("INTERNAL", "out of memory");
    if (v->ops->guest_command(v, "guest-exec", g, timeout, &ret, &qe) < 0)
        FAIL(guest_code(&qe), "vm %s: %s", v->cfg->name, qe.msg);
    if (!json_is_integer(json_object_get(ret, "pid")))
        FAIL("GUEST_ERROR", "vm %s: guest-exec: the reply has no pid",
             v->cfg->name);
    pid = json_integer_value(json_object_get(ret, "pid"));
    log_info("event=guest_exec vm=%s path=%s pid=%lld", v->cfg->name, path,
             (long long)pid);
    for (;;) {
        json_decref(st);
        st = NULL;
        left = (int)(deadline - mono_ms());
        if (left <= 0)
            break;
        if (v->ops->guest_command(v, "guest-exec-status",
                                  json_pack("{s:I}", "pid", pid),
                                  left < STATUS_CALL_MS ? left :
                                  STATUS_CALL_MS, &st, &qe) < 0) {
            if (qe.kind == QMP_E_TIMEOUT)
                continue;   /* the loop's deadline decides */
            *err_result = json_pack("{s:I}", "pid", pid);
            FAIL("GUEST_ERROR", "vm %s: %s", v->cfg->name, qe.msg);
        }
        if (json_is_true(json_object_get(st, "exited")))
            break;
        left = (int)(deadline - mono_ms());
        sleep_ms(step < left ? step : (left > 0 ? left : 0));
        step = step * 2 > 1000 ? 1000 : step * 2;
    }
    if (!st) {
        *err_result = json_pack("{s:I}", "pid", pid);
        log_warnx("event=guest_exec_timeout vm=%s path=%s pid=%lld "
                  "timeout_ms=%d", v->cfg->name, path, (long long)pid,
                  timeout);
        FAIL("GUEST_TIMEOUT", "vm %s: %s (guest pid %lld) did not exit "
             "within %d ms; it may still run in the guest", v->cfg->name,
             path, (long long)pid, timeout);
    }
    r = json_pack("{s:s,s:I,s:O,s:O,s:f}", "vm", v->cfg->name, "pid", pid,
                  "exitcode", json_object_get(st, "exitcode") ?
                  json_object_get(st, "exitcode") : json_null(),
                  "signal", json_object_get(st, "signal") ?
                  json_object_get(st, "signal") : json_null(),
                  "exec_ms", mono_ms() - t0);
    if (!r ||
        put_output(r, "stdout", json_string_value(json_object_get(
                   st, "out-data")), json_is_true(json_object_get(
                   st, "out-truncated"))) < 0 ||
        put_output(r, "stderr", json_string_value(json_object_get(
                   st, "err-data")), json_is_true(json_object_get(
                   st, "err-truncated"))) < 0) {
        json_decref(r);
        r = NULL;
        FAIL("GUEST_ERROR", "vm %s: guest-exec-status: output that is not "
             "base64", v->cfg->name);
    }
    log_info("event=guest_exec_done vm=%s pid=%lld exitcode=%lld ms=%.3f",
             v->cfg->name, (long long)pid,
             (long long)json_integer_value(json_object_get(st, "exitcode")),
             mono_ms() - t0);
cleanup:
    json_decref(st);
    json_decref(ret);
    return r;
}
