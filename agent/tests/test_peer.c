/*
 * cmocka tests of a peer's identity (peer.h) from certificates built here:
 * the role is the one spiffe://cutpoint/<role> URI of the subjectAltName;
 * no such URI, an unknown role, a near miss of the prefix or two different
 * roles give no role; the serial comes out in the deny-list's form.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>
#include <openssl/x509v3.h>

#include "dispatch.h"
#include "peer.h"

/* A certificate with subjectAltName san (NULL: none); unsigned, which
 * peer_role does not look at (the handshake verified the chain). */
static X509 *
cert_with(const char *san)
{
    X509 *x = X509_new();

    assert_non_null(x);
    if (san) {
        X509_EXTENSION *e = X509V3_EXT_conf_nid(NULL, NULL,
                                                NID_subject_alt_name,
                                                (char *)san);
        assert_non_null(e);
        assert_int_equal(X509_add_ext(x, e, -1), 1);
        X509_EXTENSION_free(e);
    }
    return x;
}

static void
test_role_from_san_uri(void **state)
{
    static const struct {
        const char *san;
        unsigned role;
    } cases[] = {
        {"DNS:coordinator,URI:spiffe://cutpoint/coordinator",
         PEER_ROLE_COORDINATOR},
        {"DNS:hv1,IP:10.0.0.1,URI:spiffe://cutpoint/agent", PEER_ROLE_AGENT},
        {"URI:spiffe://cutpoint/operator", PEER_ROLE_OPERATOR},
        /* the same role twice is still that role */
        {"URI:spiffe://cutpoint/agent,URI:spiffe://cutpoint/agent",
         PEER_ROLE_AGENT},
        {"DNS:coordinator", PEER_ROLE_NONE},            /* CN/DNS never count */
        {"URI:spiffe://cutpoint/root", PEER_ROLE_NONE},
        {"URI:spiffe://cutpoint/coordinatorx", PEER_ROLE_NONE},
        {"URI:spiffe://cutpoint/", PEER_ROLE_NONE},
        {"URI:spiffe://other/coordinator", PEER_ROLE_NONE},
        {"URI:https://cutpoint/coordinator", PEER_ROLE_NONE},
        {"URI:spiffe://cutpoint/agent,URI:spiffe://cutpoint/coordinator",
         PEER_ROLE_NONE},
        {NULL, PEER_ROLE_NONE},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        X509 *x = cert_with(cases[i].san);
        unsigned got = peer_role(x);
        if (got != cases[i].role)
            fail_msg("%s: role %s, want %s", cases[i].san ? cases[i].san :
                     "(no SAN)", peer_role_name(got),
                     peer_role_name(cases[i].role));
        X509_free(x);
    }
    assert_int_equal(peer_role(NULL), PEER_ROLE_NONE);
}

static void
test_serial_normal_form(void **state)
{
    X509 *x = cert_with(NULL);
    char buf[41], small[3];

    (void)state;
    assert_int_equal(ASN1_INTEGER_set(X509_get_serialNumber(x), 0x0a1b2c), 1);
    assert_int_equal(peer_serial(x, buf, sizeof(buf)), 0);
    assert_string_equal(buf, "A1B2C");
    assert_int_equal(peer_serial(x, small, sizeof(small)), -1);
    X509_free(x);
}

static void
test_role_names(void **state)
{
    char buf[64];

    (void)state;
    assert_string_equal(peer_role_name(PEER_ROLE_COORDINATOR), "coordinator");
    assert_string_equal(peer_role_name(PEER_ROLE_NONE), "none");
    peer_roles_text(PEER_ROLE_COORDINATOR | PEER_ROLE_OPERATOR, buf,
                    sizeof(buf));
    assert_string_equal(buf, "coordinator,operator");
    peer_roles_text(0, buf, sizeof(buf));
    assert_string_equal(buf, "none");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_role_from_san_uri),
        cmocka_unit_test(test_serial_normal_form),
        cmocka_unit_test(test_role_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
