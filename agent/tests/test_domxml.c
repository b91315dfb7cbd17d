/*
 * cmocka tests of domxml.c: what the libvirt driver reads from a domain
 * XML.  The first document is the live XML libvirt 9.0 gave here for a
 * domain with an RBD network disk (virsh dumpxml, trimmed of devices the
 * parser skips); the others vary one thing each.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "domxml.h"

static const char live_rbd[] =
    "<domain type='qemu' id='3'>\n"
    "  <name>cp-lvtest-rbd</name>\n"
    "  <uuid>3b2f7c4e-0d4f-4a51-9a2e-1f0c2d3e4f50</uuid>\n"
    "  <devices>\n"
    "    <emulator>/usr/bin/qemu-system-x86_64</emulator>\n"
    "    <disk type='network' device='disk'>\n"
    "      <driver name='qemu' type='raw'/>\n"
    "      <auth username='cutpoint'>\n"
    "        <secret type='ceph' uuid='6f1c1a55-0000-4000-8000-000000000001'/>\n"
    "      </auth>\n"
    "      <source protocol='rbd' name='rbd/cp-lvtest-rbd-d0' index='2'>\n"
    "        <host name='10.77.0.2' port='6789'/>\n"
    "      </source>\n"
    "      <target dev='vda' bus='virtio'/>\n"
    "      <alias name='virtio-disk0'/>\n"
    "    </disk>\n"
    "    <disk type='file' device='disk'>\n"
    "      <driver name='qemu' type='qcow2'/>\n"
    "      <source file='/var/tmp/cp/d1.qcow2' index='1'/>\n"
    "      <target dev='vdb' bus='virtio'/>\n"
    "    </disk>\n"
    "    <disk type='file' device='cdrom'>\n"
    "      <target dev='hdc' bus='ide'/>\n"
    "    </disk>\n"
    "    <channel type='unix'>\n"
    "      <source mode='bind' path='/run/libvirt/qemu/channel/3/org.qemu.guest_agent.0'/>\n"
    "      <target type='virtio' name='org.qemu.guest_agent.0' state='disconnected'/>\n"
    "    </channel>\n"
    "  </devices>\n"
    "</domain>\n";

static void
test_live_xml(void **state)
{
    struct domxml x;
    char err[256] = "";

    (void)state;
    assert_int_equal(domxml_parse(live_rbd, strlen(live_rbd), &x, err,
                                  sizeof(err)), 0);
    assert_string_equal(x.name, "cp-lvtest-rbd");
    assert_string_equal(x.uuid, "3b2f7c4e-0d4f-4a51-9a2e-1f0c2d3e4f50");
    assert_int_equal(x.ndisks, 2);
    assert_string_equal(x.disks[0].node, "vda");
    assert_int_equal(x.disks[0].backend, CFG_BACKEND_RBD);
    assert_string_equal(x.disks[0].pool, "rbd");
    assert_string_equal(x.disks[0].image, "cp-lvtest-rbd-d0");
    assert_int_equal(x.index[0], 2);
    assert_string_equal(x.disks[1].node, "vdb");
    assert_int_equal(x.disks[1].backend, CFG_BACKEND_QCOW2);
    assert_string_equal(x.disks[1].file, "/var/tmp/cp/d1.qcow2");
    assert_int_equal(x.index[1], 1);
    assert_int_equal(x.nunsupported, 0);       /* the cdrom is not data */
    assert_int_equal(x.guest_agent, 1);
}

/* One <devices> body per case, wrapped in a minimal domain. */
static int
parse_devices(const char *devices, struct domxml *x, char *err, size_t len)
{
    char doc[2048];

    snprintf(doc, sizeof(doc), "<domain type='qemu'><name>d</name>"
             "<devices>%s</devices></domain>", devices);
    return domxml_parse(doc, strlen(doc), x, err, len);
}

static void
test_unsupported_disks_are_listed(void **state)
{
    struct domxml x;
    char err[256] = "";

    (void)state;
    assert_int_equal(parse_devices(
        "<disk type='block' device='disk'><source dev='/dev/sdb'/>"
        "<target dev='vda'/></disk>"
        "<disk type='file' device='disk'><driver type='raw'/>"
        "<source file='/x.img'/><target dev='vdb'/></disk>"
        "<disk type='network' device='disk'>"
        "<source protocol='rbd' name='rbd/ns/img'/><target dev='vdc'/></disk>"
        "<disk type='network' device='disk'>"
        "<source protocol='nbd' name='x'/><target dev='vdd'/></disk>"
        "<disk type='volume' device='disk'><source pool='p' volume='v'/>"
        "<target dev='vde'/></disk>"
        "<disk type='file' device='disk'><driver type='qcow2'/>"
        "<source file='rel.qcow2'/><target dev='vdf'/></disk>",
        &x, err, sizeof(err)), 0);
    assert_int_equal(x.ndisks, 0);
    assert_int_equal(x.nunsupported, 6);
    assert_string_equal(x.unsupported[0].target, "vda");
    assert_string_equal(x.unsupported[0].why, "block device");
    assert_string_equal(x.unsupported[1].why, "file disk that is not qcow2");
    assert_string_equal(x.unsupported[2].why,
                        "rbd namespaces are not supported");
    assert_string_equal(x.unsupported[3].why,
                        "network disk that is not rbd");
    assert_string_equal(x.unsupported[4].why, "storage pool volume");
    assert_string_equal(x.unsupported[5].target, "vdf");
    assert_int_equal(x.guest_agent, 0);
}

static void
test_bad_documents(void **state)
{
    struct domxml x;
    char err[256] = "", big[4096];

    (void)state;
    assert_int_equal(domxml_parse("", 0, &x, err, sizeof(err)), -1);
    assert_string_equal(err, "not a libvirt domain XML");
    assert_int_equal(domxml_parse("<network/>", 10, &x, err, sizeof(err)),
                     -1);
    assert_int_equal(domxml_parse("<domain><name/></domain>", 24, &x, err,
                                  sizeof(err)), -1);
    assert_string_equal(err, "domain XML without a usable <name>");
    assert_int_equal(parse_devices("<disk type='file' device='disk'>"
                                   "<driver type='qcow2'/>"
                                   "<source file='/a'/></disk>", &x, err,
                                   sizeof(err)), -1);
    assert_string_equal(err, "a disk without a usable <target dev=...>");
    assert_int_equal(parse_devices(
        "<disk type='file' device='disk'><driver type='qcow2'/>"
        "<source file='/a'/><target dev='vda'/></disk>"
        "<disk type='file' device='disk'><driver type='qcow2'/>"
        "<source file='/b'/><target dev='vda'/></disk>",
        &x, err, sizeof(err)), -1);
    assert_string_equal(err, "two disks with target vda");
    /* more disks than a VM may have */
    big[0] = '\0';
    for (int i = 0; i < CFG_MAX_DISKS + 1; i++) {
        char one[200];
        snprintf(one, sizeof(one), "<disk type='network' device='disk'>"
                 "<source protocol='rbd' name='p/i%d'/>"
                 "<target dev='vd%c'/></disk>", i, 'a' + i);
        strcat(big, one);
    }
    {
        char doc[6000];
        snprintf(doc, sizeof(doc), "<domain><name>d</name><devices>%s"
                 "</devices></domain>", big);
        assert_int_equal(domxml_parse(doc, strlen(doc), &x, err, sizeof(err)),
                         -1);
        assert_string_equal(err, "more than 16 disks");
    }
    /* an entity is not expanded, and nothing is fetched */
    {
        const char *xxe = "<!DOCTYPE d [<!ENTITY e SYSTEM 'file:///etc/passwd'>]>"
                          "<domain><name>&e;</name></domain>";
        int rc = domxml_parse(xxe, strlen(xxe), &x, err, sizeof(err));
        assert_true(rc == -1 || strstr(x.name, "root:") == NULL);
    }
}

static void
test_with_uuid(void **state)
{
    struct domxml x;
    char err[256] = "", *out;

    (void)state;
    out = domxml_with_uuid("<domain type='qemu'><name>d</name></domain>",
                           "3b2f7c4e-0d4f-4a51-9a2e-1f0c2d3e4f50", err,
                           sizeof(err));
    assert_non_null(out);
    assert_int_equal(domxml_parse(out, strlen(out), &x, err, sizeof(err)), 0);
    assert_string_equal(x.uuid, "3b2f7c4e-0d4f-4a51-9a2e-1f0c2d3e4f50");
    free(out);
    /* one that has a UUID keeps it */
    out = domxml_with_uuid(live_rbd, "00000000-0000-4000-8000-000000000000",
                           err, sizeof(err));
    assert_non_null(out);
    assert_int_equal(domxml_parse(out, strlen(out), &x, err, sizeof(err)), 0);
    assert_string_equal(x.uuid, "3b2f7c4e-0d4f-4a51-9a2e-1f0c2d3e4f50");
    free(out);
    assert_null(domxml_with_uuid("<x/>", "u", err, sizeof(err)));
}

/* The metadata element as `virsh metadata test
 * https://cutpoint.dev/xmlns/agent/1 --key cutpoint --set '<managed/>'`
 * wrote it (libvirt 9.0, test:///default, then dumpxml); matched by the
 * namespace, not the prefix. */
static void
test_managed_metadata(void **state)
{
    struct domxml x;
    char err[256] = "";
    static const char *tagged[] = {
        "<domain type='test'><name>test</name><metadata>\n"
        "    <cutpoint:managed xmlns:cutpoint=\"https://cutpoint.dev/xmlns/"
        "agent/1\"/>\n  </metadata></domain>",
        "<domain><name>d</name><metadata><other xmlns='urn:x'/>"
        "<m:managed xmlns:m='https://cutpoint.dev/xmlns/agent/1'/>"
        "</metadata></domain>",
    }, *untagged[] = {
        "<domain><name>d</name></domain>",
        "<domain><name>d</name><metadata><managed/></metadata></domain>",
        "<domain><name>d</name><metadata><c:managed xmlns:c='https://"
        "cutpoint.dev/xmlns/agent/2'/></metadata></domain>",
        "<domain><name>d</name><metadata><cutpoint:other xmlns:cutpoint="
        "'https://cutpoint.dev/xmlns/agent/1'/></metadata></domain>",
        "<domain><name>d</name><devices><metadata><c:managed xmlns:c='https://"
        "cutpoint.dev/xmlns/agent/1'/></metadata></devices></domain>",
    };

    (void)state;
    for (size_t i = 0; i < sizeof(tagged) / sizeof(*tagged); i++) {
        assert_int_equal(domxml_parse(tagged[i], strlen(tagged[i]), &x, err,
                                      sizeof(err)), 0);
        assert_int_equal(x.managed, 1);
    }
    for (size_t i = 0; i < sizeof(untagged) / sizeof(*untagged); i++) {
        assert_int_equal(domxml_parse(untagged[i], strlen(untagged[i]), &x,
                                      err, sizeof(err)), 0);
        assert_int_equal(x.managed, 0);
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_live_xml),
        cmocka_unit_test(test_unsupported_disks_are_listed),
        cmocka_unit_test(test_bad_documents),
        cmocka_unit_test(test_with_uuid),
        cmocka_unit_test(test_managed_metadata),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
