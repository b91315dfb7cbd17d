/* cmocka tests of sdnotify.c against a datagram socket of our own, as
 * systemd's $NOTIFY_SOCKET would be. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "sdnotify.h"

/* A bound datagram socket; path "@..." binds an abstract one. */
static int
listen_at(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t n = strlen(path);
    int fd = socket(AF_UNIX, SOCK_DGRAM, 0);

    assert_true(fd >= 0);
    memcpy(sa.sun_path, path, n);
    if (path[0] == '@')
        sa.sun_path[0] = '\0';
    assert_int_equal(bind(fd, (struct sockaddr *)&sa,
                          (socklen_t)(offsetof(struct sockaddr_un, sun_path) +
                                      n + (path[0] == '/'))), 0);
    return fd;
}

static void
expect_datagram(int fd, const char *want)
{
    char buf[256];
    ssize_t n = recv(fd, buf, sizeof(buf) - 1, MSG_DONTWAIT);

    assert_true(n > 0);
    buf[n] = '\0';
    assert_string_equal(buf, want);
}

static void
test_ready_and_watchdog_to_path(void **state)
{
    char dir[] = "/tmp/cp-notify-XXXXXX", path[256];
    int fd;

    (void)state;
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/notify", dir);
    fd = listen_at(path);
    setenv("NOTIFY_SOCKET", path, 1);
    assert_int_equal(sdnotify_send("READY=1"), 0);
    expect_datagram(fd, "READY=1");
    assert_int_equal(sdnotify_send("WATCHDOG=1"), 0);
    expect_datagram(fd, "WATCHDOG=1");
    close(fd);
    unlink(path);
    rmdir(dir);
}

static void
test_abstract_socket(void **state)
{
    char name[64];
    int fd;

    (void)state;
    snprintf(name, sizeof(name), "@cp-notify-test-%d", (int)getpid());
    fd = listen_at(name);
    setenv("NOTIFY_SOCKET", name, 1);
    assert_int_equal(sdnotify_send("READY=1"), 0);
    expect_datagram(fd, "READY=1");
    close(fd);
}

static void
test_outside_systemd_is_a_noop(void **state)
{
    (void)state;
    unsetenv("NOTIFY_SOCKET");
    assert_int_equal(sdnotify_send("READY=1"), 1);
    setenv("NOTIFY_SOCKET", "relative/path", 1);
    assert_int_equal(sdnotify_send("READY=1"), -1);
    unsetenv("NOTIFY_SOCKET");
}

static void
test_watchdog_interval(void **state)
{
    char pid[32];

    (void)state;
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
    assert_true(sdnotify_watchdog_ms() == 0);
    setenv("WATCHDOG_USEC", "10000000", 1);         /* WatchdogSec=10 */
    assert_true(sdnotify_watchdog_ms() == 5000);
    snprintf(pid, sizeof(pid), "%d", (int)getpid());
    setenv("WATCHDOG_PID", pid, 1);
    assert_true(sdnotify_watchdog_ms() == 5000);
    setenv("WATCHDOG_PID", "1", 1);                 /* meant for another */
    assert_true(sdnotify_watchdog_ms() == 0);
    unsetenv("WATCHDOG_PID");
    setenv("WATCHDOG_USEC", "12x", 1);
    assert_true(sdnotify_watchdog_ms() == 0);
    unsetenv("WATCHDOG_USEC");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ready_and_watchdog_to_path),
        cmocka_unit_test(test_abstract_socket),
        cmocka_unit_test(test_outside_systemd_is_a_noop),
        cmocka_unit_test(test_watchdog_interval),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
