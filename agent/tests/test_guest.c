/*
 * cmocka tests of vm.guest_ping and vm.guest_exec (cmd_guest.c) on a qmp
 * VM whose `qga =` socket is served by a replay of what a real
 * qemu-guest-agent answered (tests/qga-replies/guest.json, recorded by
 * tests/record_qga.py from Debian's qemu-ga).  The driver opens one
 * connection per command and syncs first, so the peer answers every
 * guest-sync-delimited with the id it was sent, and replays the recorded
 * non-sync steps in order, checking each request's command and arguments
 * against the recording; past the end of the recording it repeats the
 * last reply (a process that keeps running).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <jansson.h>

#include "agent.h"
#include "cmd.h"
#include "fakepeer.h"

static struct agent a;

struct peer {
    int lfd;
    json_t *steps;          /* the scenario without its sync steps */
    int mismatches, requests;
    char path[108];
    pthread_t th;
};

static struct peer p;

static double
clock_zero(void *opaque)
{
    (void)opaque;
    return 0;
}

/* latin-1 text (as jansson's UTF-8) to bytes */
static size_t
to_bytes(const char *s, char *out, size_t cap)
{
    size_t n = 0;
    const unsigned char *q = (const unsigned char *)s;

    while (*q && n < cap) {
        if (*q >= 0xc0 && q[1]) {
            out[n++] = (char)(((q[0] & 0x1f) << 6) | (q[1] & 0x3f));
            q += 2;
        } else {
            out[n++] = (char)*q++;
        }
    }
    return n;
}

static json_t *
load(const char *which)
{
    const char *path = getenv("QGA_GUEST_REPLIES");
    json_error_t je;
    json_t *all = json_load_file(path ? path : "guest.json", 0, &je);
    json_t *steps = json_array(), *st;
    size_t i;

    if (!all)
        fail_msg("cannot load recording: %s", je.text);
    json_array_foreach(json_object_get(all, which), i, st) {
        const char *text = json_string_value(json_array_get(st, 1));
        if (strstr(text, "guest-sync-delimited") ||
            (unsigned char)text[0] == 0xc3)     /* U+00FF: sync reply */
            continue;
        json_array_append(steps, st);
    }
    json_decref(all);
    assert_true(json_array_size(steps) > 0);
    return steps;
}

static void
write_text(int fd, const char *text)
{
    static char bytes[1 << 20];
    size_t n = to_bytes(text, bytes, sizeof(bytes));

    if (write(fd, bytes, n) != (ssize_t)n)
        return;
}

static void *
peer_main(void *arg)
{
    static char line[1 << 16];
    struct peer *pp = arg;
    size_t next = 0;
    const char *last = NULL;
    int fd;

    while ((fd = accept(pp->lfd, NULL, NULL)) >= 0) {
        while (fakepeer_read_line(fd, line, sizeof(line)) == 0) {
            json_t *got = json_loads(line, 0, NULL), *exp = NULL;
            const char *cmd = json_string_value(json_object_get(got,
                                                                "execute"));

            pp->requests++;
            if (cmd && strcmp(cmd, "guest-sync-delimited") == 0) {
                char r[128];
                snprintf(r, sizeof(r), "\xff{\"return\": %lld}\n",
                         (long long)json_integer_value(json_object_get(
                             json_object_get(got, "arguments"), "id")));
                if (write(fd, r, strlen(r)) < 0)
                    break;
                json_decref(got);
                continue;
            }
            if (next < json_array_size(pp->steps)) {
                exp = json_loads(json_string_value(json_array_get(
                    json_array_get(pp->steps, next), 1)), 0, NULL);
                json_t *ga = json_object_get(got, "arguments");
                json_t *ea = json_object_get(exp, "arguments");
                if (!fakepeer_same_execute(got, exp) ||
                    (ga || ea ? !json_equal(ga, ea) : 0))
                    pp->mismatches++;
                last = json_string_value(json_array_get(
                    json_array_get(pp->steps, next + 1), 1));
                next += 2;
            }
            json_decref(exp);
            json_decref(got);
            if (last)
                write_text(fd, last);
        }
        close(fd);
    }
    return NULL;
}

static void
setup(const char *scenario)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};

    memset(&a, 0, sizeof(a));
    memset(&p, 0, sizeof(p));
    snprintf(a.cfg.host, sizeof(a.cfg.host), "h1");
    a.cfg.qmp_timeout_ms = 500;
    pthread_mutex_init(&a.mu, NULL);
    pthread_cond_init(&a.cond, NULL);
    txn_table_init(&a.txns, clock_zero, NULL);
    snprintf(a.cfg.vms[0].name, sizeof(a.cfg.vms[0].name), "g1");
    snprintf(a.cfg.vms[0].driver, sizeof(a.cfg.vms[0].driver), "qmp");
    snprintf(a.cfg.vms[0].qmp, sizeof(a.cfg.vms[0].qmp),
             "/nonexistent/g1.qmp");
    snprintf(p.path, sizeof(p.path), "/tmp/cp-test-guest-%d.sock",
             (int)getpid());
    snprintf(a.cfg.vms[0].qga, sizeof(a.cfg.vms[0].qga), "%s", p.path);
    a.cfg.vms[0].method = CFG_METHOD_QMP;
    a.cfg.nvms = 1;
    assert_int_equal(vm_open(&a.vms[0], &a.cfg.vms[0], NULL), 0);
    a.nvms = 1;
    if (!scenario)
        return;
    p.steps = load(scenario);
    unlink(p.path);
    strcpy(sa.sun_path, p.path);
    p.lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_int_equal(bind(p.lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(p.lfd, 4), 0);
    assert_int_equal(pthread_create(&p.th, NULL, peer_main, &p), 0);
}

static void
teardown(void)
{
    if (p.steps) {
        shutdown(p.lfd, SHUT_RDWR);
        close(p.lfd);
        pthread_join(p.th, NULL);
        unlink(p.path);
        json_decref(p.steps);
    }
    txn_table_clear(&a.txns);
    vm_close(&a.vms[0]);
    pthread_cond_destroy(&a.cond);
    pthread_mutex_destroy(&a.mu);
}

/* Runs handler h on args (a JSON text); *code NULL on success. */
static json_t *
run(cmd_handler *h, const char *args, const char **code, char *msg,
    json_t **err_result)
{
    json_t *j = json_loads(args, 0, NULL);
    json_t *r;

    assert_non_null(j);
    *code = NULL;
    *err_result = NULL;
    msg[0] = '\0';
    r = h(&a, j, code, msg, 512, err_result);
    json_decref(j);
    return r;
}

static void
test_ping(void **state)
{
    const char *code;
    char msg[512];
    json_t *er, *r;

    (void)state;
    setup("ping");
    r = run(cmd_vm_guest_ping, "{\"vm\":\"g1\"}", &code, msg, &er);
    assert_non_null(r);
    assert_string_equal(json_string_value(json_object_get(r, "vm")), "g1");
    assert_true(json_real_value(json_object_get(r, "ping_ms")) >= 0);
    json_decref(r);
    teardown();
    assert_int_equal(p.mismatches, 0);
}

/* stdin sent base64-encoded, both streams decoded, a non-zero exit code
 * is a result */
static void
test_exec_output_and_exit_code(void **state)
{
    const char *code;
    char msg[512];
    json_t *er, *r;

    (void)state;
    setup("exec");
    r = run(cmd_vm_guest_exec, "{\"vm\":\"g1\",\"path\":\"/bin/sh\","
            "\"args\":[\"-c\",\"cat; echo out-line; echo err-line >&2; "
            "exit 3\"],\"input\":\"input-line\\n\"}", &code, msg, &er);
    if (!r)
        fail_msg("%s: %s", code, msg);
    assert_int_equal(json_integer_value(json_object_get(r, "exitcode")), 3);
    assert_true(json_is_null(json_object_get(r, "signal")));
    assert_string_equal(json_string_value(json_object_get(r, "stdout")),
                        "input-line\nout-line\n");
    assert_string_equal(json_string_value(json_object_get(r, "stderr")),
                        "err-line\n");
    assert_true(json_is_false(json_object_get(r, "stdout_truncated")));
    assert_true(json_integer_value(json_object_get(r, "pid")) > 0);
    json_decref(r);
    teardown();
    assert_int_equal(p.mismatches, 0);
}

/* polled until exited; a byte that is not UTF-8 becomes '?' */
static void
test_exec_polls_and_cleans_utf8(void **state)
{
    const char *code;
    char msg[512];
    json_t *er, *r;

    (void)state;
    setup("exec_slow");
    r = run(cmd_vm_guest_exec, "{\"vm\":\"g1\",\"path\":\"/bin/sh\","
            "\"args\":[\"-c\",\"sleep 0.5; printf 'caf\\\\303\\\\251 "
            "\\\\377'\"]}", &code, msg, &er);
    if (!r)
        fail_msg("%s: %s", code, msg);
    assert_int_equal(json_integer_value(json_object_get(r, "exitcode")), 0);
    assert_string_equal(json_string_value(json_object_get(r, "stdout")),
                        "caf\xc3\xa9 ?");
    assert_string_equal(json_string_value(json_object_get(r, "stderr")), "");
    json_decref(r);
    teardown();
    assert_int_equal(p.mismatches, 0);
    assert_true(p.requests >= 3);
}

static void
test_exec_missing_program(void **state)
{
    const char *code;
    char msg[512];
    json_t *er, *r;

    (void)state;
    setup("exec_missing");
    r = run(cmd_vm_guest_exec, "{\"vm\":\"g1\",\"path\":"
            "\"/nonexistent/prog\"}", &code, msg, &er);
    assert_null(r);
    assert_string_equal(code, "GUEST_ERROR");
    assert_non_null(strstr(msg, "vm g1: guest-exec: "));
    assert_non_null(strstr(msg, "Failed to execute"));
    teardown();
    assert_int_equal(p.mismatches, 0);
}

static void
test_exec_output_capped(void **state)
{
    const char *code;
    char msg[512];
    json_t *er, *r;

    (void)state;
    setup("exec_big");
    r = run(cmd_vm_guest_exec, "{\"vm\":\"g1\",\"path\":\"/bin/sh\","
            "\"args\":[\"-c\",\"head -c 100000 /dev/zero | tr '\\\\0' x\"]}",
            &code, msg, &er);
    if (!r)
        fail_msg("%s: %s", code, msg);
    assert_int_equal(json_string_length(json_object_get(r, "stdout")),
                     65536);
    assert_true(json_is_true(json_object_get(r, "stdout_truncated")));
    assert_true(json_is_false(json_object_get(r, "stderr_truncated")));
    json_decref(r);
    teardown();
    assert_int_equal(p.mismatches, 0);
}

/* a process still running at the deadline: GUEST_TIMEOUT with its pid */
static void
test_exec_deadline(void **state)
{
    const char *code;
    char msg[512];
    json_t *er, *r;

    (void)state;
    setup("exec_long");
    r = run(cmd_vm_guest_exec, "{\"vm\":\"g1\",\"path\":\"/bin/sleep\","
            "\"args\":[\"30\"],\"timeout_ms\":1200}", &code, msg, &er);
    assert_null(r);
    assert_string_equal(code, "GUEST_TIMEOUT");
    assert_non_null(strstr(msg, "did not exit within 1200 ms"));
    assert_true(json_integer_value(json_object_get(er, "pid")) > 0);
    json_decref(er);
    teardown();
    assert_int_equal(p.mismatches, 0);
    assert_true(p.requests >= 4);   /* syncs and polls until the deadline */
}

static void
test_no_guest_agent_listening(void **state)
{
    const char *code;
    char msg[512];
    json_t *er, *r;

    (void)state;
    setup(NULL);
    r = run(cmd_vm_guest_ping, "{\"vm\":\"g1\"}", &code, msg, &er);
    assert_null(r);
    assert_string_equal(code, "GUEST_ERROR");
    assert_non_null(strstr(msg, "connect"));
    r = run(cmd_vm_guest_ping, "{\"vm\":\"nope\"}", &code, msg, &er);
    assert_null(r);
    assert_string_equal(code, "UNKNOWN_VM");
    teardown();
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ping),
        cmocka_unit_test(test_exec_output_and_exit_code),
        cmocka_unit_test(test_exec_polls_and_cleans_utf8),
        cmocka_unit_test(test_exec_missing_program),
        cmocka_unit_test(test_exec_output_capped),
        cmocka_unit_test(test_exec_deadline),
        cmocka_unit_test(test_no_guest_agent_listening),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
