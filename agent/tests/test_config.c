/* cmocka tests of config.c: the INI file and its -n checks. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"

static struct agent_config cfg;

static int
load(const char *text, char *err, size_t errlen)
{
    char path[] = "/tmp/cp-config-XXXXXX";
    int fd = mkstemp(path), rc;

    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    rc = config_load(path, &cfg, err, errlen);
    unlink(path);
    return rc;
}

#define TLS "[tls]\nca = /c\ncert = /p\nkey = /k\n"

static void
test_full(void **state)
{
    char err[512];

    (void)state;
    assert_int_equal(load("[agent]\nhost = h1 ; comment\nlisten = 10.0.0.1:7000\n"
                          "qmp_timeout_ms = 1500\nfreeze_timeout_ms = 2500\n"
                          "storage_probe_ms = 0\n" TLS
                          "[ceph]\nconf = /etc/ceph.conf\n"
                          "[vm a]\nqmp = /s\ndisk.disk0 = rbd:rbd/img0\n"
                          "disk.disk1 = rbd:rbd/img1\n"
                          "[vm b]\nqmp = /t\nqga = /t.qga\nid = vm-b.1:x\n"
                          "disk.disk0 = qcow2:/x.qcow2\n",
                          err, sizeof(err)), 0);
    assert_string_equal(cfg.host, "h1");
    assert_string_equal(cfg.listen_addr, "10.0.0.1");
    assert_int_equal(cfg.listen_port, 7000);
    assert_int_equal(cfg.qmp_timeout_ms, 1500);
    assert_int_equal(cfg.freeze_timeout_ms, 2500);
    assert_int_equal(cfg.storage_probe_ms, 0);
    assert_int_equal(cfg.nvms, 2);
    assert_int_equal(cfg.vms[0].ndisks, 2);
    assert_string_equal(cfg.vms[0].disks[1].image, "img1");
    /* auto: all-rbd with a [ceph] section → rbd, else QMP transaction */
    assert_int_equal(cfg.vms[0].method, CFG_METHOD_RBD);
    assert_int_equal(cfg.vms[1].method, CFG_METHOD_QMP);
    assert_string_equal(cfg.vms[1].disks[0].file, "/x.qcow2");
    assert_string_equal(cfg.vms[0].qga, "");
    assert_string_equal(cfg.vms[1].qga, "/t.qga");
    assert_string_equal(cfg.vms[0].uid, "");
    assert_string_equal(cfg.vms[1].uid, "vm-b.1:x");
}

/* pause_path (agent-protocol §5.1): redirect unless in_pause or live is set. */
static void
test_pause_path(void **state)
{
    char err[512];

    (void)state;
    assert_int_equal(load("[agent]\nhost = h1\n" TLS, err, sizeof(err)), 0);
    assert_int_equal(cfg.pause_in_pause, 0);
    assert_int_equal(load("[agent]\nhost = h1\npause_path = in_pause\n" TLS, err,
                          sizeof(err)), 0);
    assert_int_equal(cfg.pause_in_pause, 1);
    assert_int_equal(load("[agent]\nhost = h1\npause_path = redirect\n" TLS, err,
                          sizeof(err)), 0);
    assert_int_equal(cfg.pause_in_pause, 0);
    assert_int_equal(cfg.pause_live, 0);
    assert_int_equal(load("[agent]\nhost = h1\npause_path = live\n" TLS, err,
                          sizeof(err)), 0);
    assert_int_equal(cfg.pause_in_pause, 0);
    assert_int_equal(cfg.pause_live, 1);
    assert_int_equal(load("[agent]\nhost = h1\npause_path = fast\n" TLS, err,
                          sizeof(err)), -1);
    assert_non_null(strstr(err, "pause_path"));
}

/* redirect_inline_max (agent-protocol §5.1): 8 unless set, 0..64. */
static void
test_redirect_inline_max(void **state)
{
    char err[512];

    (void)state;
    assert_int_equal(load("[agent]\nhost = h1\n" TLS, err, sizeof(err)), 0);
    assert_int_equal(cfg.redirect_inline_max, 8);
    assert_int_equal(load("[agent]\nhost = h1\nredirect_inline_max = 0\n" TLS,
                          err, sizeof(err)), 0);
    assert_int_equal(cfg.redirect_inline_max, 0);
    assert_int_equal(load("[agent]\nhost = h1\nredirect_inline_max = 65\n" TLS,
                          err, sizeof(err)), -1);
    assert_non_null(strstr(err, "redirect_inline_max"));
}

static void
test_errors_name_the_line(void **state)
{
    char err[512];

    (void)state;
    assert_int_equal(load("[agent]\nlisten = nope\n" TLS, err, sizeof(err)), -1);
    assert_non_null(strstr(err, ":2: bad value for listen"));
    assert_int_equal(load("[agent]\nbogus = 1\n" TLS, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "unknown key bogus"));
    assert_int_equal(load("[nope]\n", err, sizeof(err)), -1);
    assert_non_null(strstr(err, "unknown section"));
    assert_int_equal(load("[agent]\n", err, sizeof(err)), -1);
    assert_non_null(strstr(err, "[tls] ca, cert and key are required"));
    assert_int_equal(load(TLS "[vm a]\nqmp = /s\ndisk.d0 = nfs:/x\n", err,
                          sizeof(err)), -1);
    assert_non_null(strstr(err, "bad value for disk.d0"));
    assert_int_equal(load(TLS "[vm a]\ndisk.d0 = qcow2:/x\n", err,
                          sizeof(err)), -1);
    assert_non_null(strstr(err, "needs qmp = SOCKET"));
    assert_int_equal(load(TLS "[vm a]\nqmp = /s\nmethod = rbd\n"
                          "disk.d0 = qcow2:/x\n", err, sizeof(err)), -1);
    assert_non_null(strstr(err, "method = rbd needs only rbd disks"));
    assert_int_equal(load(TLS "[vm a]\ndriver = libvirt\n", err, sizeof(err)),
                     -1);
    assert_non_null(strstr(err, "[libvirt] uri is not set"));
    assert_int_equal(load(TLS "[vm a]\nqmp=/s\n[vm a]\nqmp=/s\n", err,
                          sizeof(err)), -1);
    assert_non_null(strstr(err, "defined twice"));
    assert_int_equal(load(TLS "[vm a]\nqmp=/s\nqga = rel.sock\n", err,
                          sizeof(err)), -1);
    assert_non_null(strstr(err, "bad value for qga"));
    /* an identity names the VM across hosts: no blanks, no slash */
    assert_int_equal(load(TLS "[vm a]\nqmp=/s\nid = a b\n", err,
                          sizeof(err)), -1);
    assert_non_null(strstr(err, "bad value for id"));
    assert_int_equal(load(TLS "[vm a]\nqmp=/s\nid = a/b\n", err,
                          sizeof(err)), -1);
    assert_non_null(strstr(err, "bad value for id"));
    assert_int_equal(config_load("/nonexistent.ini", &cfg, err, sizeof(err)),
                     -1);
}

/* A value is stored whole or the file is refused: a path cut at its
 * field's size would name another file, and the rest of a long line
 * would be read as a line of its own. */
static void
test_long_values_are_refused_not_cut(void **state)
{
    char err[512], text[4096], path[1100];

    (void)state;
    memset(path, 'j', sizeof(path));
    path[0] = '/';
    path[sizeof(path) - 1] = '\0';         /* 1099 bytes: > journal[1024] */
    snprintf(text, sizeof(text), "[agent]\njournal = %s\n" TLS, path);
    assert_int_equal(load(text, err, sizeof(err)), -1);
    assert_non_null(strstr(err, ":2: value of journal is too long (1099 bytes)"));
    path[1023] = '\0';                      /* 1023 bytes: fits */
    snprintf(text, sizeof(text), "[agent]\njournal = %s\n" TLS, path);
    assert_int_equal(load(text, err, sizeof(err)), 0);
    assert_string_equal(cfg.journal, path);
    /* a line past the reader's buffer, whose tail looks like a key */
    memset(text, 0, sizeof(text));
    snprintf(text, sizeof(text), TLS "[vm a]\nqmp = /");
    memset(text + strlen(text), 'q', 2100);
    strcat(text, "qmp = /other\n");
    assert_int_equal(load(text, err, sizeof(err)), -1);
    assert_non_null(strstr(err, ":6: line longer than 2046 bytes"));
    /* a disk image name and a VM name past their fields */
    memset(path, 'i', 300);
    path[300] = '\0';
    snprintf(text, sizeof(text), TLS "[vm a]\nqmp = /s\ndisk.d0 = rbd:p/%s\n",
             path);
    assert_int_equal(load(text, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "bad value for disk.d0"));
    path[280] = '\0';          /* the section fits its 300, not the name */
    snprintf(text, sizeof(text), TLS "[vm %s]\nqmp = /s\n", path);
    assert_int_equal(load(text, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "VM name empty or too long"));
    path[200] = '\0';
    snprintf(text, sizeof(text), TLS "[%s]\n", path);
    assert_int_equal(load(text, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "unknown section"));
    memset(path, 's', 400);
    path[400] = '\0';
    snprintf(text, sizeof(text), TLS "[vm %s]\n", path);
    assert_int_equal(load(text, err, sizeof(err)), -1);
    assert_non_null(strstr(err, ":5: section name too long"));
}

static void
test_start_command(void **state)
{
    char err[512];

    (void)state;
    assert_int_equal(load(TLS "[vm a]\nqmp = /s\nstart = /bin/true  x\ty\n"
                          "[vm b]\nqmp = /t\nstart_timeout_ms = 5000\n",
                          err, sizeof(err)), 0);
    assert_string_equal(cfg.vms[0].start, "/bin/true  x\ty");
    assert_int_equal(cfg.vms[0].start_timeout_ms, 60000);
    assert_string_equal(cfg.vms[1].start, "");
    assert_int_equal(cfg.vms[1].start_timeout_ms, 5000);
    /* no PATH search: the program is an absolute path */
    assert_int_equal(load(TLS "[vm a]\nqmp = /s\nstart = true\n", err,
                          sizeof(err)), -1);
    assert_non_null(strstr(err, ":7: bad value for start"));
    /* -n finds a program that cannot run */
    assert_int_equal(load(TLS "[vm a]\nqmp = /s\nstart = /nonexistent/x a\n",
                          err, sizeof(err)), -1);
    assert_non_null(strstr(err, "[vm a] start: /nonexistent/x"));
    {
        char text[256], plain[] = "/tmp/cp-config-noexec-XXXXXX";
        int fd = mkstemp(plain);    /* mode 0600: not executable */

        assert_true(fd >= 0);
        close(fd);
        snprintf(text, sizeof(text), TLS "[vm a]\nqmp = /s\nstart = %s\n",
                 plain);
        assert_int_equal(load(text, err, sizeof(err)), -1);
        unlink(plain);
        assert_non_null(strstr(err, "Permission denied"));
    }
    assert_int_equal(load(TLS "[libvirt]\nuri = test:///default\n[vm a]\n"
                          "driver = libvirt\nstart = /bin/true\n", err,
                          sizeof(err)), -1);
    assert_non_null(strstr(err, "start = is for the qmp driver"));
    assert_int_equal(load(TLS "[vm a]\nqmp = /s\nstart_timeout_ms = 5\n",
                          err, sizeof(err)), -1);
    assert_non_null(strstr(err, "bad value for start_timeout_ms"));
}

/* [libvirt] manage and manage_metadata: which domains discovery takes. */
static void
test_libvirt_manage(void **state)
{
    char err[512];

    (void)state;
    /* no selection: every domain */
    assert_int_equal(load(TLS "[libvirt]\nuri = test:///default\n"
                          "discover = yes\n", err, sizeof(err)), 0);
    assert_true(config_libvirt_manages(&cfg, "anything", 0));
    /* a name pattern */
    assert_int_equal(load(TLS "[libvirt]\nuri = test:///default\n"
                          "discover = yes\nmanage = prod-[a-c]*\n", err,
                          sizeof(err)), 0);
    assert_string_equal(cfg.libvirt_manage, "prod-[a-c]*");
    assert_true(config_libvirt_manages(&cfg, "prod-b7", 0));
    assert_false(config_libvirt_manages(&cfg, "prod-d7", 1));
    assert_false(config_libvirt_manages(&cfg, "test-a", 1));
    /* the metadata element */
    assert_int_equal(load(TLS "[libvirt]\nuri = test:///default\n"
                          "discover = yes\nmanage_metadata = yes\n", err,
                          sizeof(err)), 0);
    assert_true(config_libvirt_manages(&cfg, "x", 1));
    assert_false(config_libvirt_manages(&cfg, "x", 0));
    /* both: both must hold */
    assert_int_equal(load(TLS "[libvirt]\nuri = test:///default\n"
                          "discover = yes\nmanage = db*\n"
                          "manage_metadata = yes\n", err, sizeof(err)), 0);
    assert_true(config_libvirt_manages(&cfg, "db1", 1));
    assert_false(config_libvirt_manages(&cfg, "db1", 0));
    assert_false(config_libvirt_manages(&cfg, "web1", 1));
    /* refused: a pattern that would not mean what it says, a bad yes/no */
    assert_int_equal(load(TLS "[libvirt]\nuri = test:///default\n"
                          "discover = yes\nmanage = web[12\n", err,
                          sizeof(err)), -1);
    assert_non_null(strstr(err, ":8: bad value for manage: web[12"));
    assert_int_equal(load(TLS "[libvirt]\ndiscover = yes\nmanage =\n", err,
                          sizeof(err)), -1);
    assert_non_null(strstr(err, "bad value for manage"));
    assert_int_equal(load(TLS "[libvirt]\ndiscover = yes\nmanage = a\\\n",
                          err, sizeof(err)), -1);
    assert_non_null(strstr(err, "bad value for manage"));
    assert_int_equal(load(TLS "[libvirt]\ndiscover = yes\n"
                          "manage_metadata = maybe\n", err, sizeof(err)), -1);
    assert_non_null(strstr(err, "bad value for manage_metadata: maybe"));
    /* refused: a selection without discovery, which nothing would use */
    assert_int_equal(load(TLS "[libvirt]\nuri = test:///default\n"
                          "manage = db*\n", err, sizeof(err)), -1);
    assert_non_null(strstr(err, "[libvirt] manage selects the domains "
                           "discovery takes, but discover is not yes"));
    assert_int_equal(load(TLS "[libvirt]\nuri = test:///default\n"
                          "discover = no\nmanage_metadata = yes\n", err,
                          sizeof(err)), -1);
    assert_non_null(strstr(err, "[libvirt] manage_metadata selects"));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full),
        cmocka_unit_test(test_errors_name_the_line),
        cmocka_unit_test(test_long_values_are_refused_not_cut),
        cmocka_unit_test(test_start_command),
        cmocka_unit_test(test_pause_path),
        cmocka_unit_test(test_redirect_inline_max),
        cmocka_unit_test(test_libvirt_manage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
