/*
 * cmocka tests of a signed VM definition (defsig.c, cmd_vmdef.c): the
 * verify alone (a good signature, a changed byte of the XML or of the
 * signature, a signature made for another VM name, another key, no key
 * configured), then vm.start through the command table against libvirt's
 * own test driver (test:///default, in libvirt itself): a signed
 * definition is defined and started, an unsigned, forged or misnamed one
 * is FORBIDDEN and the domain stays undefined; vm.definition returns the
 * inactive XML of a libvirt VM.  The key pair is made here (Ed25519, as the
 * control plane's), the public half written as PEM where
 * [libvirt] definition_key would name it.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <libvirt/libvirt.h>

#include "agent.h"
#include "config.h"
#include "defsig.h"
#include "dispatch.h"
#include "mono.h"
#include "proto.h"

static char pub_path[64], other_path[64];
static EVP_PKEY *key, *other;

static EVP_PKEY *
make_key(char *path, size_t pathlen)
{
    EVP_PKEY_CTX *c = EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, NULL);
    EVP_PKEY *k = NULL;
    FILE *f;

    assert_non_null(c);
    assert_int_equal(EVP_PKEY_keygen_init(c), 1);
    assert_int_equal(EVP_PKEY_keygen(c, &k), 1);
    EVP_PKEY_CTX_free(c);
    snprintf(path, pathlen, "/tmp/cp-defsig-XXXXXX");
    close(mkstemp(path));
    assert_non_null(f = fopen(path, "w"));
    assert_int_equal(PEM_write_PUBKEY(f, k), 1);
    fclose(f);
    return k;
}

/* base64 of k's signature of DEFSIG_CONTEXT NUL vm NUL xml (the control
 * plane's message, api/services/vmdef_sign.py). */
static void
sign(EVP_PKEY *k, const char *vm, const char *xml, char out[89])
{
    size_t clen = sizeof(DEFSIG_CONTEXT), vlen = strlen(vm) + 1;
    size_t len = clen + vlen + strlen(xml), siglen = 64;
    unsigned char *msg = malloc(len), sig[64];
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();

    memcpy(msg, DEFSIG_CONTEXT, clen);
    memcpy(msg + clen, vm, vlen);
    memcpy(msg + clen + vlen, xml, strlen(xml));
    assert_int_equal(EVP_DigestSignInit(ctx, NULL, NULL, NULL, k), 1);
    assert_int_equal(EVP_DigestSign(ctx, sig, &siglen, msg, len), 1);
    assert_int_equal(siglen, 64);
    assert_int_equal(EVP_EncodeBlock((unsigned char *)out, sig, 64), 88);
    EVP_MD_CTX_free(ctx);
    free(msg);
}

static int
setup(void **state)
{
    (void)state;
    key = make_key(pub_path, sizeof(pub_path));
    other = make_key(other_path, sizeof(other_path));
    return 0;
}

static int
teardown(void **state)
{
    (void)state;
    unlink(pub_path);
    unlink(other_path);
    EVP_PKEY_free(key);
    EVP_PKEY_free(other);
    return 0;
}

#define XML "<domain type='test'><name>dr1</name><memory>1024</memory>" \
            "<os><type>hvm</type></os></domain>"

static void
test_verify(void **state)
{
    char sig[89], bad[89], why[512];
    const char *xml = XML;
    char *changed = strdup(XML);

    (void)state;
    sign(key, "dr1", xml, sig);
    assert_int_equal(defsig_verify(pub_path, "dr1", xml, strlen(xml), sig,
                                   why, sizeof(why)), 0);
    /* one byte of the XML changed */
    changed[strlen(changed) - 3] = 'X';
    assert_int_equal(defsig_verify(pub_path, "dr1", changed, strlen(changed),
                                   sig, why, sizeof(why)), -1);
    assert_non_null(strstr(why, "does not verify"));
    /* one character of the signature changed */
    memcpy(bad, sig, sizeof(bad));
    bad[10] = bad[10] == 'A' ? 'B' : 'A';
    assert_int_equal(defsig_verify(pub_path, "dr1", xml, strlen(xml), bad,
                                   why, sizeof(why)), -1);
    assert_non_null(strstr(why, "does not verify"));
    /* the same XML under another VM's name */
    assert_int_equal(defsig_verify(pub_path, "dr2", xml, strlen(xml), sig,
                                   why, sizeof(why)), -1);
    assert_non_null(strstr(why, "for vm dr2"));
    /* signed by a key that is not the configured one */
    sign(other, "dr1", xml, bad);
    assert_int_equal(defsig_verify(pub_path, "dr1", xml, strlen(xml), bad,
                                   why, sizeof(why)), -1);
    /* no key configured, a missing key file, not a signature */
    assert_int_equal(defsig_verify("", "dr1", xml, strlen(xml), sig, why,
                                   sizeof(why)), -1);
    assert_non_null(strstr(why, "no definition-signing key"));
    assert_int_equal(defsig_verify("/nonexistent/k.pem", "dr1", xml,
                                   strlen(xml), sig, why, sizeof(why)), -1);
    assert_non_null(strstr(why, "No such file"));
    assert_int_equal(defsig_verify(pub_path, "dr1", xml, strlen(xml), "abc",
                                   why, sizeof(why)), -1);
    assert_non_null(strstr(why, "not base64 of 64 bytes"));
    assert_int_equal(defsig_verify(pub_path, "dr1", xml, strlen(xml), NULL,
                                   why, sizeof(why)), -1);
    free(changed);
}

/* ---- through the command table, on libvirt's test driver ---------------- */

static struct agent a;

static double
clock_zero(void *opaque)
{
    (void)opaque;
    return 0;
}

static void
agent_setup(const char *keypath)
{
    char err[256];
    double end = mono_ms() + 10000;

    memset(&a, 0, sizeof(a));
    snprintf(a.cfg.host, sizeof(a.cfg.host), "h1");
    a.cfg.qmp_timeout_ms = 2000;
    snprintf(a.cfg.definition_key, sizeof(a.cfg.definition_key), "%s",
             keypath);
    snprintf(a.cfg.libvirt_uri, sizeof(a.cfg.libvirt_uri), "test:///default");
    pthread_mutex_init(&a.mu, NULL);
    pthread_cond_init(&a.cond, NULL);
    txn_table_init(&a.txns, clock_zero, NULL);
    /* one libvirt VM: the test driver's own running domain "test" */
    snprintf(a.cfg.vms[0].name, sizeof(a.cfg.vms[0].name), "test");
    snprintf(a.cfg.vms[0].domain, sizeof(a.cfg.vms[0].domain), "test");
    snprintf(a.cfg.vms[0].driver, sizeof(a.cfg.vms[0].driver), "libvirt");
    a.cfg.vms[0].start_timeout_ms = 10000;
    a.cfg.vms[0].method = CFG_METHOD_QMP;    /* no disks: never used */
    a.cfg.nvms = 1;
    assert_int_equal(vm_host_open(&a.host, &a.cfg, err, sizeof(err)), 0);
    while (vm_host_ready(&a.host, err, sizeof(err)) < 0 && mono_ms() < end)
        usleep(20000);
    assert_int_equal(vm_host_ready(&a.host, err, sizeof(err)), 0);
    assert_int_equal(vm_open(&a.vms[0], &a.cfg.vms[0], &a.host), 0);
    vm_attach(&a.vms[0], &a.host);
    a.nvms = 1;
}

static void
agent_teardown(void)
{
    vm_close(&a.vms[0]);
    vm_host_close(&a.host);
    txn_table_clear(&a.txns);
    pthread_cond_destroy(&a.cond);
    pthread_mutex_destroy(&a.mu);
}

/* vm.start of spec {vm, xml, sig?, transient?}; *code NULL on success. */
static json_t *
start_spec(const char *vm, const char *xml, const char *sig,
           json_t *transient, const char **code, char *msg, size_t msglen)
{
    json_t *spec = json_pack("{s:s,s:s}", "vm", vm, "xml", xml);
    json_t *req = json_pack("{s:i,s:s,s:{s:o}}", "id", 1, "cmd", "vm.start",
                            "args", "spec", spec), *r, *er = NULL;
    struct proto_request pr;
    struct proto_error perr = {0};
    char *text;
    int bad_frame = 0;

    if (sig)
        json_object_set_new(spec, "sig", json_string(sig));
    if (transient)
        json_object_set_new(spec, "transient", transient);
    text = json_dumps(req, JSON_COMPACT);
    assert_int_equal(proto_parse_request((const uint8_t *)text, strlen(text),
                                         &pr, &bad_frame, &perr), 0);
    *code = NULL;
    msg[0] = '\0';
    r = dispatch_run(&a, &pr, code, msg, msglen, &er);
    json_decref(er);
    proto_request_clear(&pr);
    free(text);
    json_decref(req);
    return r;
}

static json_t *
start(const char *vm, const char *xml, const char *sig, const char **code,
      char *msg, size_t msglen)
{
    return start_spec(vm, xml, sig, NULL, code, msg, msglen);
}

/* The test driver's state of domain name: -1 not defined. */
static int
domain_state(const char *name)
{
    virConnectPtr c = virConnectOpen("test:///default");
    virDomainPtr d = c ? virDomainLookupByName(c, name) : NULL;
    int st = -1, reason;

    if (d) {
        virDomainGetState(d, &st, &reason, 0);
        virDomainFree(d);
    }
    if (c)
        virConnectClose(c);
    return st;
}

static void
test_signed_start(void **state)
{
    const char *code;
    char sig[89], other_sig[89], msg[512];
    json_t *r;

    (void)state;
    agent_setup(pub_path);
    assert_int_equal(domain_state("dr1"), -1);
    /* unsigned, forged (another key), signed for another name */
    r = start("dr1", XML, NULL, &code, msg, sizeof(msg));
    assert_null(r);
    assert_string_equal(code, "FORBIDDEN");
    assert_non_null(strstr(msg, "signature (args.spec.sig)"));
    sign(other, "dr1", XML, other_sig);
    r = start("dr1", XML, other_sig, &code, msg, sizeof(msg));
    assert_null(r);
    assert_string_equal(code, "FORBIDDEN");
    assert_non_null(strstr(msg, "does not verify"));
    sign(key, "dr2", XML, sig);
    r = start("dr1", XML, sig, &code, msg, sizeof(msg));
    assert_null(r);
    assert_string_equal(code, "FORBIDDEN");
    assert_int_equal(domain_state("dr1"), -1);
    /* signed for the name it is sent with, but defining another domain */
    r = start("dr2", XML, sig, &code, msg, sizeof(msg));
    assert_null(r);
    assert_string_equal(code, "BAD_REQUEST");
    assert_non_null(strstr(msg, "names domain dr1"));
    assert_int_equal(domain_state("dr2"), -1);
    /* signed: defined and started; again: already running */
    sign(key, "dr1", XML, sig);
    r = start("dr1", XML, sig, &code, msg, sizeof(msg));
    if (!r)
        fail_msg("signed start: %s %s", code, msg);
    assert_string_equal(json_string_value(json_object_get(r, "state")),
                        "running");
    assert_string_equal(json_string_value(json_object_get(r, "definition")),
                        "signed");
    json_decref(r);
    assert_int_equal(domain_state("dr1"), VIR_DOMAIN_RUNNING);
    r = start("dr1", XML, sig, &code, msg, sizeof(msg));
    assert_non_null(r);
    assert_true(json_is_true(json_object_get(r, "already_running")));
    json_decref(r);
    agent_teardown();
}

/* transient: started with nothing defined, so that a destroy (vm.stop)
 * leaves no domain behind (a drill's copy) */
static void
test_signed_transient_start(void **state)
{
    const char *code;
    char sig[89], msg[512];
    const char *xml = "<domain type='test'><name>dr5</name><memory>1024"
                      "</memory><os><type>hvm</type></os></domain>";
    virConnectPtr c;
    virDomainPtr d;
    json_t *r;

    (void)state;
    agent_setup(pub_path);
    sign(key, "dr5", xml, sig);
    r = start_spec("dr5", xml, sig, json_string("yes"), &code, msg,
                   sizeof(msg));
    assert_null(r);
    assert_string_equal(code, "BAD_REQUEST");
    assert_int_equal(domain_state("dr5"), -1);
    r = start_spec("dr5", xml, sig, json_true(), &code, msg, sizeof(msg));
    if (!r)
        fail_msg("transient start: %s %s", code, msg);
    json_decref(r);
    assert_int_equal(domain_state("dr5"), VIR_DOMAIN_RUNNING);
    c = virConnectOpen("test:///default");
    assert_non_null(c);
    d = virDomainLookupByName(c, "dr5");
    assert_non_null(d);
    assert_int_equal(virDomainIsPersistent(d), 0);
    assert_int_equal(virDomainDestroy(d), 0);
    virDomainFree(d);
    virConnectClose(c);
    assert_int_equal(domain_state("dr5"), -1);
    agent_teardown();
}

static void
test_no_key_configured(void **state)
{
    const char *code;
    char sig[89], msg[512];
    json_t *r;

    (void)state;
    agent_setup("");
    sign(key, "dr3", XML, sig);
    r = start("dr3", XML, sig, &code, msg, sizeof(msg));
    assert_null(r);
    assert_string_equal(code, "FORBIDDEN");
    assert_non_null(strstr(msg, "no [libvirt] definition_key"));
    assert_int_equal(domain_state("dr3"), -1);
    agent_teardown();
}

/* Signed is not safe: a definition that names host files outside this
 * agent's [libvirt] definition_paths, or a host device, is refused before
 * libvirt sees it (defpolicy.h), and the same kernel is started once the
 * policy allows its directory. */
static void
test_signed_but_outside_the_policy(void **state)
{
    const char *code;
    char sig[89], msg[512];
    const char *kernel = "<domain type='test'><name>dr6</name><memory>1024"
                         "</memory><os><type>hvm</type><kernel>/srv/cp-boot/"
                         "vmlinuz</kernel></os></domain>";
    const char *serial = "<domain type='test'><name>dr7</name><memory>1024"
                         "</memory><os><type>hvm</type></os><devices><serial "
                         "type='file'><source path='/etc/cron.d/cp'/>"
                         "</serial></devices></domain>";
    const char *log = "<domain type='test'><name>dr8</name><memory>1024"
                      "</memory><os><type>hvm</type></os><devices><serial "
                      "type='pty'><log file='/etc/shadow'/></serial>"
                      "</devices></domain>";
    json_t *r;

    (void)state;
    agent_setup(pub_path);
    sign(key, "dr6", kernel, sig);
    r = start("dr6", kernel, sig, &code, msg, sizeof(msg));
    assert_null(r);
    assert_string_equal(code, "FORBIDDEN");
    if (!strstr(msg, "<kernel> /srv/cp-boot/vmlinuz"))
        fail_msg("%s", msg);
    assert_int_equal(domain_state("dr6"), -1);
    sign(key, "dr7", serial, sig);
    r = start("dr7", serial, sig, &code, msg, sizeof(msg));
    assert_null(r);
    assert_string_equal(code, "FORBIDDEN");
    assert_non_null(strstr(msg, "<serial type='file'>"));
    assert_int_equal(domain_state("dr7"), -1);
    snprintf(a.cfg.definition_paths, sizeof(a.cfg.definition_paths),
             "/srv/cp-boot /var/log/cp");
    sign(key, "dr8", log, sig);
    r = start("dr8", log, sig, &code, msg, sizeof(msg));
    assert_null(r);
    assert_string_equal(code, "FORBIDDEN");
    assert_non_null(strstr(msg, "<log file='/etc/shadow'>"));
    assert_int_equal(domain_state("dr8"), -1);
    sign(key, "dr6", kernel, sig);
    r = start("dr6", kernel, sig, &code, msg, sizeof(msg));
    if (!r)
        fail_msg("allowed kernel: %s %s", code, msg);
    json_decref(r);
    assert_int_equal(domain_state("dr6"), VIR_DOMAIN_RUNNING);
    agent_teardown();
}

static void
test_definition_is_the_inactive_xml(void **state)
{
    json_t *req = json_pack("{s:i,s:s,s:{s:s}}", "id", 1, "cmd",
                            "vm.definition", "args", "vm", "test");
    char *text = json_dumps(req, JSON_COMPACT), msg[512];
    struct proto_request pr;
    struct proto_error perr = {0};
    const char *code = NULL, *def;
    json_t *r, *er = NULL;
    int bad_frame = 0;

    (void)state;
    agent_setup(pub_path);
    assert_int_equal(proto_parse_request((const uint8_t *)text, strlen(text),
                                         &pr, &bad_frame, &perr), 0);
    r = dispatch_run(&a, &pr, &code, msg, sizeof(msg), &er);
    if (!r)
        fail_msg("vm.definition: %s %s", code, msg);
    assert_string_equal(json_string_value(json_object_get(r, "format")),
                        "libvirt-domain-xml");
    def = json_string_value(json_object_get(r, "definition"));
    assert_non_null(strstr(def, "<name>test</name>"));
    /* inactive: no live ids */
    assert_null(strstr(def, "<domain type='test' id="));
    assert_int_equal(strlen(json_string_value(json_object_get(r, "sha256"))),
                     64);
    json_decref(r);
    json_decref(er);
    proto_request_clear(&pr);
    free(text);
    json_decref(req);
    agent_teardown();
}

/* [libvirt] definition_key: an absolute, readable file, with uri and
 * discover = yes (a domain it defines is a VM only through discovery). */
static void
test_config_key(void **state)
{
    static struct agent_config cfg;
    char path[] = "/tmp/cp-defsig-cfg-XXXXXX", text[2048], err[512];
    const char *cases[][2] = {
        {"uri = test:///default\ndiscover = yes\ndefinition_key = %s\n", NULL},
        {"uri = test:///default\ndefinition_key = %s\n", "discover = yes"},
        {"definition_key = %s\n", "needs [libvirt] uri"},
        {"uri = test:///default\ndiscover = yes\n"
         "definition_key = %s.missing\n", "No such file"},
        {"uri = test:///default\ndiscover = yes\ndefinition_key = rel.pem\n%s",
         "definition_key"},
        {"uri = test:///default\ndiscover = yes\ndefinition_key = %s\n"
         "definition_paths = /srv/boot /var/log/cp/\n", NULL},
        {"uri = test:///default\ndiscover = yes\ndefinition_key = %s\n"
         "definition_paths = /srv/../etc\n", "definition_paths: /srv/../etc"},
        {"uri = test:///default\ndiscover = yes\ndefinition_paths = /srv\n",
         "definition_key is not set"},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int fd = mkstemp(path), n;
        char lv[1024];

        assert_true(fd >= 0);
        snprintf(lv, sizeof(lv), cases[i][0], i != 4 ? pub_path : "");
        n = snprintf(text, sizeof(text), "[tls]\nca = /c\ncert = /p\nkey = /k\n"
                     "[libvirt]\n%s", lv);
        assert_int_equal(write(fd, text, (size_t)n), n);
        close(fd);
        err[0] = '\0';
        if (!cases[i][1]) {
            if (config_load(path, &cfg, err, sizeof(err)) != 0)
                fail_msg("case %zu: %s", i, err);
            assert_string_equal(cfg.definition_key, pub_path);
        } else {
            assert_int_equal(config_load(path, &cfg, err, sizeof(err)), -1);
            if (!strstr(err, cases[i][1]))
                fail_msg("case %zu: %s", i, err);
        }
        unlink(path);
        snprintf(path, sizeof(path), "/tmp/cp-defsig-cfg-XXXXXX");
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verify),
        cmocka_unit_test(test_config_key),
        cmocka_unit_test(test_signed_start),
        cmocka_unit_test(test_signed_transient_start),
        cmocka_unit_test(test_no_key_configured),
        cmocka_unit_test(test_signed_but_outside_the_policy),
        cmocka_unit_test(test_definition_is_the_inactive_xml),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
