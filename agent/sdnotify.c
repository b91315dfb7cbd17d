/* sdnotify: see sdnotify.h. */
#include "sdnotify.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int
sdnotify_send(const char *msg)
{
    const char *path = getenv("NOTIFY_SOCKET");
    struct sockaddr_un sa;
    socklen_t salen;
    size_t n;
    int fd, rc;

    if (!path || !path[0])
        return 1;
    n = strlen(path);
    if (n >= sizeof(sa.sun_path) || (path[0] != '/' && path[0] != '@')) {
        errno = EINVAL;
        return -1;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, n);
    if (path[0] == '@')
        sa.sun_path[0] = '\0';      /* abstract namespace */
    salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n +
                        (path[0] == '/'));
    fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    rc = sendto(fd, msg, strlen(msg), MSG_NOSIGNAL, (struct sockaddr *)&sa,
                salen) < 0 ? -1 : 0;
    close(fd);
    return rc;
}

double
sdnotify_watchdog_ms(void)
{
    const char *us = getenv("WATCHDOG_USEC"), *pid = getenv("WATCHDOG_PID");
    char *end;
    unsigned long long v;

    if (!us || !us[0])
        return 0;
    if (pid && pid[0] && strtol(pid, NULL, 10) != (long)getpid())
        return 0;
    errno = 0;
    v = strtoull(us, &end, 10);
    if (errno || *end || v == 0)
        return 0;
    return (double)v / 2000.0;
}
