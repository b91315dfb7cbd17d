/*
 * cmocka tests of the command table (commands.def) as dispatch.c runs it:
 * every command the parser accepts reaches a handler, a command the table
 * does not have is UNKNOWN_COMMAND, hello lists the table, and the roles
 * column allows each command to the roles of agent-protocol §4.0.  Requests
 * go through proto_parse_request first, as the server sends them.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "agent.h"
#include "dispatch.h"
#include "proto.h"

/* An agent with one qmp VM "v" whose QEMU is not there (disk d0), no Ceph
 * and no journal: every handler gives an answer of its own. */
static struct agent a;

static double
clock_zero(void *opaque)
{
    (void)opaque;
    return 0;
}

static void
agent_setup(void)
{
    memset(&a, 0, sizeof(a));
    snprintf(a.cfg.host, sizeof(a.cfg.host), "h1");
    a.cfg.qmp_timeout_ms = 500;
    pthread_mutex_init(&a.mu, NULL);
    pthread_cond_init(&a.cond, NULL);
    txn_table_init(&a.txns, clock_zero, NULL);
    snprintf(a.cfg.vms[0].name, sizeof(a.cfg.vms[0].name), "v");
    snprintf(a.cfg.vms[0].driver, sizeof(a.cfg.vms[0].driver), "qmp");
    snprintf(a.cfg.vms[0].qmp, sizeof(a.cfg.vms[0].qmp),
             "/nonexistent/v.qmp");
    a.cfg.vms[0].method = CFG_METHOD_QMP;
    a.cfg.vms[0].ndisks = 1;
    snprintf(a.cfg.vms[0].disks[0].node, sizeof(a.cfg.vms[0].disks[0].node),
             "d0");
    a.cfg.vms[0].disks[0].backend = CFG_BACKEND_QCOW2;
    a.cfg.nvms = 1;
    assert_int_equal(vm_open(&a.vms[0], &a.cfg.vms[0], NULL), 0);
    a.nvms = 1;
}

static void
agent_teardown(void)
{
    txn_table_clear(&a.txns);
    vm_close(&a.vms[0]);
    pthread_cond_destroy(&a.cond);
    pthread_mutex_destroy(&a.mu);
}

/* Parses text as the server would and runs it; *code is NULL on success. */
static json_t *
run(const char *text, const char **code, char *msg, size_t msglen)
{
    struct proto_request req;
    struct proto_error perr = {0};
    json_t *r, *err_result = NULL;
    int bad_frame = 0;

    assert_int_equal(proto_parse_request((const uint8_t *)text, strlen(text),
                                         &req, &bad_frame, &perr), 0);
    *code = NULL;
    msg[0] = '\0';
    r = dispatch_run(&a, &req, code, msg, msglen, &err_result);
    json_decref(err_result);
    proto_request_clear(&req);
    return r;
}

static void
test_unknown_command(void **state)
{
    struct proto_request req = {0};
    const char *code = NULL;
    char msg[256] = "";
    json_t *err_result = (json_t *)&req;    /* must be reset to NULL */

    (void)state;
    agent_setup();
    req.args = json_object();
    req.cmd = PROTO_CMD_COUNT;
    assert_null(dispatch_run(&a, &req, &code, msg, sizeof(msg),
                             &err_result));
    assert_string_equal(code, "UNKNOWN_COMMAND");
    assert_string_equal(msg, "unknown command");
    assert_null(err_result);
    req.cmd = (enum proto_cmd)-1;
    code = NULL;
    assert_null(dispatch_run(&a, &req, &code, msg, sizeof(msg),
                             &err_result));
    assert_string_equal(code, "UNKNOWN_COMMAND");
    json_decref(req.args);
    assert_int_equal(dispatch_roles(PROTO_CMD_COUNT), 0);
    agent_teardown();
}

static void
test_hello_lists_the_table(void **state)
{
    const char *code;
    char msg[256];
    json_t *r, *caps, *drivers;

    (void)state;
    agent_setup();
    r = run("{\"id\":1,\"cmd\":\"hello\"}", &code, msg, sizeof(msg));
    assert_non_null(r);
    assert_null(code);
    caps = json_object_get(r, "capabilities");
    assert_int_equal(json_array_size(caps), PROTO_CMD_COUNT);
    for (int i = 0; i < PROTO_CMD_COUNT; i++)
        assert_string_equal(json_string_value(json_array_get(caps, i)),
                            proto_cmd_name(i));
    /* the wire names of agent-protocol §4, in the table's order */
    assert_string_equal(json_string_value(json_array_get(caps, 0)), "hello");
    assert_string_equal(json_string_value(json_array_get(caps, 6)),
                        "snapshot.list");
    assert_string_equal(json_string_value(json_array_get(caps, 10)), "stats");
    drivers = json_object_get(r, "drivers");
    assert_int_equal(json_array_size(drivers), 2);
    assert_string_equal(json_string_value(json_array_get(drivers, 0)), "qmp");
    assert_string_equal(json_string_value(json_array_get(drivers, 1)),
                        "libvirt");
    /* no [ceph] connection: no librbd snapshots */
    assert_int_equal(json_array_size(json_object_get(r, "snapshot_methods")),
                     1);
    assert_string_equal(json_string_value(json_object_get(r, "host")), "h1");
    json_decref(r);
    agent_teardown();
}

/* Each command reaches its own handler: the answer is one that only
 * that handler gives here (a swap of two rows of the table fails). */
static void
test_every_command_reaches_its_handler(void **state)
{
    static const struct {
        const char *req;
        const char *code;       /* NULL: a result */
        const char *what;       /* in the message, or a key of the result */
    } cases[] = {
        {"{\"id\":1,\"cmd\":\"hello\"}", NULL, "capabilities"},
        {"{\"id\":1,\"cmd\":\"inventory\"}", NULL, "vms"},
        {"{\"id\":1,\"cmd\":\"prepare\",\"args\":{\"txn\":\"t1\","
         "\"vms\":[\"v\"],\"lease_ms\":500,\"quiesce\":\"no\"}}",
         "BAD_REQUEST", "args.quiesce"},
        {"{\"id\":1,\"cmd\":\"commit\",\"args\":{\"txn\":\"t1\","
         "\"snapshots\":{},\"budget_ms\":100}}", "UNKNOWN_TXN",
         "never prepared"},
        {"{\"id\":1,\"cmd\":\"abort\",\"args\":{\"txn\":\"t1\"}}", NULL,
         "not_deleted"},
        {"{\"id\":1,\"cmd\":\"resume\",\"args\":{\"vms\":[\"v\"]}}",
         "QMP_ERROR", "vm v: "},
        {"{\"id\":1,\"cmd\":\"snapshot.list\",\"args\":{\"disk\":"
         "\"v/d0\"}}", "QMP_ERROR", "query-block"},
        {"{\"id\":1,\"cmd\":\"snapshot.delete\",\"args\":{\"disk\":"
         "\"v/d0\",\"name\":\"s\"}}", "SNAPSHOT_FAILED",
         "blockdev-snapshot-delete-internal-sync"},
        {"{\"id\":1,\"cmd\":\"vm.start\",\"args\":{\"spec\":{}}}",
         "BAD_REQUEST", "args.spec needs vm"},
        {"{\"id\":1,\"cmd\":\"vm.stop\",\"args\":{\"vm\":\"v\"}}", NULL,
         "state"},
        {"{\"id\":1,\"cmd\":\"stats\"}", NULL, "uptime_ms"},
        {"{\"id\":1,\"cmd\":\"vm.definition\",\"args\":{\"vm\":\"v\"}}",
         "BAD_REQUEST", "keeps no definition"},
        {"{\"id\":1,\"cmd\":\"vm.guest_ping\",\"args\":{\"vm\":\"v\"}}",
         "GUEST_ERROR", "no guest agent socket"},
        {"{\"id\":1,\"cmd\":\"vm.guest_exec\",\"args\":{\"vm\":\"v\","
         "\"path\":\"/bin/true\",\"args\":[\"-x\",\"-x\",\"\"]}}",
         "GUEST_ERROR", "guest-exec"},
    };
    const char *code;
    char msg[256];

    (void)state;
    assert_int_equal(sizeof(cases) / sizeof(cases[0]), PROTO_CMD_COUNT);
    agent_setup();
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *r = run(cases[i].req, &code, msg, sizeof(msg));

        if (cases[i].code) {
            if (!code || strcmp(code, cases[i].code) ||
                !strstr(msg, cases[i].what))
                fail_msg("%s: got %s \"%s\", want %s \"...%s...\"",
                         cases[i].req, code ? code : "a result", msg,
                         cases[i].code, cases[i].what);
            assert_null(r);
        } else {
            if (code || !json_object_get(r, cases[i].what))
                fail_msg("%s: got %s \"%s\", want a result with %s",
                         cases[i].req, code ? code : "a result", msg,
                         cases[i].what);
        }
        json_decref(r);
    }
    agent_teardown();
}

/* The roles column (commands.def): what the coordinator's certificate
 * may run (every command: the control plane, the coordinator CLI and
 * failover use it), what the operator's may (reading only), and that an
 * agent's certificate, or one with no role, runs nothing. */
/* vm.start never runs a definition sent on the wire, whoever sends it:
 * with the libvirt test driver connected, the domain would be created. */
static void
test_vm_start_refuses_a_definition(void **state)
{
    const char *code;
    char msg[256];
    json_t *r;

    (void)state;
    agent_setup();
    snprintf(a.cfg.libvirt_uri, sizeof(a.cfg.libvirt_uri),
             "test:///default");
    assert_int_equal(vm_host_open(&a.host, &a.cfg, msg, sizeof(msg)), 0);
    r = run("{\"id\":1,\"cmd\":\"vm.start\",\"args\":{\"spec\":{\"xml\":"
            "\"<domain type='test'><name>evil</name><memory>1024</memory>"
            "<os><type>hvm</type></os></domain>\"}}}", &code, msg,
            sizeof(msg));
    assert_null(r);
    assert_string_equal(code, "FORBIDDEN");
    assert_non_null(strstr(msg, "configuration"));
    vm_host_close(&a.host);
    agent_teardown();
}

static void
test_roles_per_command(void **state)
{
    static const struct {
        const char *cmd;
        int operator_may;
    } rows[] = {
        {"hello", 1}, {"inventory", 1}, {"prepare", 0}, {"commit", 0},
        {"abort", 0}, {"resume", 0}, {"snapshot.list", 1},
        {"snapshot.delete", 0}, {"vm.start", 0}, {"vm.stop", 0},
        {"stats", 1}, {"vm.definition", 0}, {"vm.guest_ping", 0},
        {"vm.guest_exec", 0},
    };
    const char *code;
    char msg[256];

    (void)state;
    assert_int_equal(sizeof(rows) / sizeof(rows[0]), PROTO_CMD_COUNT);
    for (int i = 0; i < PROTO_CMD_COUNT; i++) {
        assert_string_equal(proto_cmd_name(i), rows[i].cmd);
        code = NULL;
        assert_int_equal(dispatch_allows(i, PEER_ROLE_COORDINATOR, &code, msg,
                                         sizeof(msg)), 0);
        assert_null(code);
        assert_int_equal(dispatch_allows(i, PEER_ROLE_OPERATOR, &code, msg,
                                         sizeof(msg)),
                         rows[i].operator_may ? 0 : -1);
        assert_int_equal(dispatch_allows(i, PEER_ROLE_AGENT, &code, msg,
                                         sizeof(msg)), -1);
        assert_string_equal(code, "FORBIDDEN");
        assert_int_equal(dispatch_allows(i, PEER_ROLE_NONE, &code, msg,
                                         sizeof(msg)), -1);
        assert_string_equal(code, "FORBIDDEN");
    }
    assert_int_equal(dispatch_allows(PROTO_CMD_PREPARE, PEER_ROLE_AGENT,
                                     &code, msg, sizeof(msg)), -1);
    assert_string_equal(msg, "prepare needs the role coordinator; this "
                        "certificate's role is agent");
    assert_int_equal(dispatch_allows(PROTO_CMD_COUNT, PEER_ROLE_COORDINATOR,
                                     &code, msg, sizeof(msg)), -1);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unknown_command),
        cmocka_unit_test(test_hello_lists_the_table),
        cmocka_unit_test(test_every_command_reaches_its_handler),
        cmocka_unit_test(test_roles_per_command),
        cmocka_unit_test(test_vm_start_refuses_a_definition),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
