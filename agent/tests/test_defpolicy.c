/*
 * cmocka tests of defpolicy.c: what a signed definition may contain.
 * The shapes the control plane signs (lab-rbd-dr.xml and lab-boot-dr.xml of api/tests/data/domains,
 * written by vmdef_rewrite.py and kept current by test_vmdef_policy.py)
 * pass with the paths they name allowed and are refused without them;
 * each hostile element a lying primary host could send is refused, named.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "defpolicy.h"

#define PATHS "/var/lib/cutpoint/boot /var/log/cutpoint/console " \
              "/etc/ceph/cutpoint-dr.conf"

static char *
shape(const char *name)
{
    const char *dir = getenv("DOMAIN_SHAPES");
    char path[1024];
    FILE *f;
    char *buf;
    long n;

    assert_non_null(dir);
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    assert_non_null(f = fopen(path, "rb"));
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    rewind(f);
    assert_non_null(buf = calloc(1, (size_t)n + 1));
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    return buf;
}

static void
test_signed_shapes_pass(void **state)
{
    char why[512] = "";
    char *rbd = shape("lab-rbd-dr.xml"), *boot = shape("lab-boot-dr.xml");

    (void)state;
    if (defpolicy_check(rbd, strlen(rbd), PATHS, why, sizeof(why)) < 0)
        fail_msg("lab-rbd-dr.xml: %s", why);
    if (defpolicy_check(boot, strlen(boot), PATHS, why, sizeof(why)) < 0)
        fail_msg("lab-boot-dr.xml: %s", why);
    /* the Ceph conf is a path too: only the site's own */
    assert_int_equal(defpolicy_check(rbd, strlen(rbd), "/var/lib/cutpoint/boot",
                                     why, sizeof(why)), -1);
    assert_non_null(strstr(why, "<config file='/etc/ceph/cutpoint-dr.conf'>"));
    /* no definition_paths: the direct kernel boot shape is refused */
    assert_int_equal(defpolicy_check(boot, strlen(boot), "", why, sizeof(why)),
                     -1);
    assert_non_null(strstr(why, "<kernel> /var/lib/cutpoint/boot/vmlinuz"));
    free(rbd);
    free(boot);
}

/* The recorded capture itself (as the primary's agent gave it) is not
 * the signed shape: its seclabel and primary paths are the rewrite's to
 * remove. */
static void
test_captured_shape_is_refused(void **state)
{
    char why[512] = "";
    char *xml = shape("lab-rbd.xml");

    (void)state;
    assert_int_equal(defpolicy_check(xml, strlen(xml), PATHS, why,
                                     sizeof(why)), -1);
    assert_non_null(strstr(why, "<seclabel>"));
    free(xml);
}

static const char head[] =
    "<domain type='qemu'><name>v</name><memory>65536</memory>"
    "<os><type>hvm</type>%s</os><devices>"
    "<emulator>/usr/bin/qemu-system-x86_64</emulator>%s</devices>%s"
    "</domain>";

static const struct {
    const char *os, *dev, *tail, *why;
} hostile[] = {
    {"<kernel>/etc/shadow</kernel>", "", "", "<kernel> /etc/shadow"},
    {"<initrd>/var/lib/cutpoint/boot/../../../etc/shadow</initrd>", "", "",
     "<initrd> /var/lib/cutpoint/boot/../"},
    {"<kernel>etc/shadow</kernel>", "", "", "<kernel> etc/shadow"},
    {"<kernel>/var/lib/cutpoint/boot-x</kernel>", "", "", "<kernel> /var/lib"},
    {"<kernel><x/>/etc/shadow</kernel>", "", "", "<kernel> with child"},
    {"<dtb>/etc/shadow</dtb>", "", "", "<dtb> /etc/shadow"},
    {"<loader type='pflash'>/etc/shadow</loader>", "", "", "<loader>"},
    {"<nvram template='/etc/shadow'/>", "", "", "<nvram template="},
    {"<acpi><table type='slic'>/x</table></acpi>", "", "", "<acpi>"},
    {"", "<serial type='pty'><log file='/etc/shadow'/></serial>", "",
     "<log file='/etc/shadow'>"},
    {"", "<serial type='file'><source path='/etc/cron.d/x'/></serial>", "",
     "<serial type='file'>"},
    {"", "<channel type='unix'><source mode='bind' path='/etc/x'/>"
     "<target type='virtio'/></channel>", "", "<source path='/etc/x'>"},
    {"", "<disk type='file' device='disk'><source file='/etc/shadow'/>"
     "<target dev='vda'/></disk>", "", "not an RBD network disk"},
    {"", "<disk type='block' device='lun'><source dev='/dev/sda'/>"
     "<target dev='sda'/></disk>", "", "<disk device='lun'>"},
    {"", "<disk type='file' device='cdrom'><source file='/etc/shadow'/>"
     "<target dev='hdc'/></disk>", "", "<disk device='cdrom'> with a"},
    {"", "<disk type='network' device='disk'><source protocol='rbd' "
     "name='p/i'><host transport='unix' socket='/run/x'/></source>"
     "<target dev='vda'/></disk>", "", "<host socket='/run/x'>"},
    {"", "<disk type='network' device='disk'><source protocol='rbd' "
     "name='p/i'/><backingStore type='file'><source file='/etc/shadow'/>"
     "</backingStore><target dev='vda'/></disk>", "", "<backingStore>"},
    {"", "<disk type='network' device='disk'><source protocol='rbd' "
     "name='p/i'><config file='/etc/shadow'/></source><target dev='vda'/>"
     "</disk>", "", "<config file='/etc/shadow'>"},
    {"", "<hostdev mode='subsystem' type='pci'/>", "", "<hostdev>"},
    {"", "<filesystem type='mount'><source dir='/'/><target dir='r'/>"
     "</filesystem>", "", "<filesystem>"},
    {"", "<shmem name='x'/>", "", "<shmem>"},
    {"", "<redirdev bus='usb' type='spicevmc'/>", "", "<redirdev>"},
    {"", "<smartcard mode='host'/>", "", "<smartcard>"},
    {"", "<interface type='ethernet'><script path='/tmp/x'/></interface>", "",
     "<interface type='ethernet'>"},
    {"", "<interface type='bridge'><source bridge='b'/><script path='/tmp/x'/>"
     "</interface>", "", "host script"},
    {"", "<interface type='bridge'><source bridge='b'/><target dev='eth0' "
     "managed='no'/></interface>", "", "managed='no'"},
    {"", "<interface type='bridge'><source bridge='b'/><rom file='/etc/x'/>"
     "</interface>", "", "<rom file='/etc/x'>"},
    {"", "<interface type='bridge'><source bridge='b'/><backend "
     "tap='/dev/net/tun'/></interface>", "", "<backend> is not allowed"},
    {"", "<graphics type='vnc' socket='/etc/x'/>", "", "<graphics socket="},
    {"", "<rng model='virtio'><backend model='random'>/etc/shadow</backend>"
     "</rng>", "", "<rng> backend /etc/shadow"},
    {"", "<tpm model='tpm-tis'><backend type='passthrough'><device "
     "path='/dev/tpm0'/></backend></tpm>", "", "<tpm> backend that is not"},
    {"", "<input type='evdev'><source dev='/dev/input/event0'/></input>", "",
     "<input type='evdev'>"},
    {"", "<memory model='nvdimm'><source><path>/etc/shadow</path></source>"
     "</memory>", "", "<path> /etc/shadow"},
    {"", "<lease><lockspace>x</lockspace></lease>", "", "<lease>"},
    {"", "", "<qemu:commandline xmlns:qemu='http://libvirt.org/schemas/"
     "domain/qemu/1.0'><qemu:arg value='-x'/></qemu:commandline>",
     "<qemu:commandline>"},
    {"", "<x:thing xmlns:x='urn:x'/>", "", "another namespace"},
    {"", "", "<seclabel type='static' model='dac'><label>+0:+0</label>"
     "</seclabel>", "<seclabel>"},
    {"", "", "<sysinfo type='fwcfg'><entry name='opt/x' file='/etc/shadow'/>"
     "</sysinfo>", "<entry file='/etc/shadow'>"},
    {"", "", "<blkiotune><device><path>/dev/sda</path></device></blkiotune>",
     "<path> /dev/sda"},
    {"", "", "<bootloader>/usr/bin/pygrub</bootloader>", "<bootloader>"},
    {"", "", "<resource><partition>/machine</partition></resource>",
     "<domain> child <resource>"},
};

static void
test_hostile_elements_refused(void **state)
{
    char xml[2048], why[512];

    (void)state;
    for (size_t i = 0; i < sizeof(hostile) / sizeof(*hostile); i++) {
        snprintf(xml, sizeof(xml), head, hostile[i].os, hostile[i].dev,
                 hostile[i].tail);
        why[0] = '\0';
        if (defpolicy_check(xml, strlen(xml), PATHS, why, sizeof(why)) == 0)
            fail_msg("case %zu allowed: %s", i, xml);
        if (!strstr(why, hostile[i].why))
            fail_msg("case %zu: \"%s\" does not say \"%s\"", i, why,
                     hostile[i].why);
    }
}

static void
test_emulator_and_doctype(void **state)
{
    char xml[2048], why[512];
    static const char *bad[] = {
        "/bin/sh", "/tmp/qemu-system-x86_64", "/usr/bin/../../tmp/kvm",
        "/usr/bin/sub/qemu-system-x86_64", "qemu-system-x86_64",
    };

    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        snprintf(xml, sizeof(xml), "<domain><name>v</name><devices><emulator>"
                 "%s</emulator></devices></domain>", bad[i]);
        assert_int_equal(defpolicy_check(xml, strlen(xml), PATHS, why,
                                         sizeof(why)), -1);
        assert_non_null(strstr(why, "<emulator>"));
    }
    snprintf(xml, sizeof(xml), "<domain><name>v</name><devices><emulator>"
             "/usr/libexec/qemu-kvm</emulator><rng model='virtio'><backend "
             "model='random'>/dev/urandom</backend></rng><input type='tablet' "
             "bus='usb'/><channel type='unix'><target type='virtio' name='x'/>"
             "</channel></devices><metadata><q:commandline xmlns:q='http://"
             "libvirt.org/schemas/domain/qemu/1.0' file='/etc/x'/></metadata>"
             "</domain>");
    if (defpolicy_check(xml, strlen(xml), "", why, sizeof(why)) < 0)
        fail_msg("benign: %s", why);
    snprintf(xml, sizeof(xml), "<!DOCTYPE domain [<!ENTITY k '/etc/shadow'>]>"
             "<domain><name>v</name><os><kernel>&k;</kernel></os></domain>");
    assert_int_equal(defpolicy_check(xml, strlen(xml), PATHS, why,
                                     sizeof(why)), -1);
    assert_non_null(strstr(why, "DOCTYPE"));
    assert_int_equal(defpolicy_check("<network/>", 10, PATHS, why,
                                     sizeof(why)), -1);
    assert_int_equal(defpolicy_check("<domain", 7, PATHS, why, sizeof(why)),
                     -1);
}

static void
test_path_allowed(void **state)
{
    char why[256];

    (void)state;
    assert_int_equal(defpolicy_path_allowed("/a/b", "/x /a"), 1);
    assert_int_equal(defpolicy_path_allowed("/a", "/a/"), 1);
    assert_int_equal(defpolicy_path_allowed("/a/b/c", "/a/b/"), 1);
    assert_int_equal(defpolicy_path_allowed("/ab", "/a"), 0);
    assert_int_equal(defpolicy_path_allowed("/a/../etc", "/a"), 0);
    assert_int_equal(defpolicy_path_allowed("/a/./b", "/a"), 0);
    assert_int_equal(defpolicy_path_allowed("/a//b", "/a"), 0);
    assert_int_equal(defpolicy_path_allowed("/a/b/", "/a"), 0);
    assert_int_equal(defpolicy_path_allowed("a/b", "/a"), 0);
    assert_int_equal(defpolicy_path_allowed("/a/b", ""), 0);
    assert_int_equal(defpolicy_path_allowed("/etc/x", "/ rel /a/../etc"), 0);
    assert_int_equal(defpolicy_paths_valid("/a /b/c/", why, sizeof(why)), 0);
    assert_int_equal(defpolicy_paths_valid("", why, sizeof(why)), 0);
    assert_int_equal(defpolicy_paths_valid("/a rel", why, sizeof(why)), -1);
    assert_non_null(strstr(why, "rel"));
    assert_int_equal(defpolicy_paths_valid("/", why, sizeof(why)), -1);
    assert_int_equal(defpolicy_paths_valid("/a/../b", why, sizeof(why)), -1);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_signed_shapes_pass),
        cmocka_unit_test(test_captured_shape_is_refused),
        cmocka_unit_test(test_hostile_elements_refused),
        cmocka_unit_test(test_emulator_and_doctype),
        cmocka_unit_test(test_path_allowed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
