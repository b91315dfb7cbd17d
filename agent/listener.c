/* listener: see listener.h. */
#include "listener.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "mono.h"

/* TCP keepalive: an idle peer that stops answering (host gone, packets
 * dropped) is seen dead after KEEPIDLE + KEEPCNT * KEEPINTVL = 8 s, and
 * one that stops acknowledging our data after USER_TIMEOUT_MS; both below
 * the 10 s the coordinator's failure detection counts on. */
#define KEEPIDLE_S 2
#define KEEPINTVL_S 2
#define KEEPCNT 3
#define USER_TIMEOUT_MS 8000
#define ACCEPT_PAUSE_MS 100

static void
set_conn_options(int fd)
{
    int on = 1, idle = KEEPIDLE_S, intvl = KEEPINTVL_S, cnt = KEEPCNT;
    unsigned ut = USER_TIMEOUT_MS;

    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, sizeof(ut));
}

static void
set_listening(struct listener *l, int on)
{
    struct epoll_event ev = {.events = on ? EPOLLIN : 0, .data.ptr = l};

    epoll_ctl(l->efd, EPOLL_CTL_MOD, l->fd, &ev);
}

int
listener_open(struct listener *l, int efd, const char *addr, int port,
              char *err, size_t errlen)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = l};
    int one = 1;

    l->fd = -1;
    l->efd = efd;
    l->paused_until = 0;
    if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1) {
        snprintf(err, errlen, "listen address %s is not an IPv4 address",
                 addr);
        return -1;
    }
    sa.sin_port = htons((uint16_t)port);
    l->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (l->fd >= 0)
        setsockopt(l->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (l->fd < 0 || bind(l->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
        listen(l->fd, 128) < 0 ||
        epoll_ctl(efd, EPOLL_CTL_ADD, l->fd, &ev) < 0) {
        snprintf(err, errlen, "listen %s:%d: %s", addr, port,
                 strerror(errno));
        return -1;
    }
    return 0;
}

int
listener_accept(struct listener *l, char *peer, size_t peerlen)
{
    struct sockaddr_in sa;
    socklen_t sl = sizeof(sa);
    int fd = accept4(l->fd, (struct sockaddr *)&sa, &sl,
                     SOCK_NONBLOCK | SOCK_CLOEXEC);

    if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE) {
            log_warn("event=accept_failed");
            l->paused_until = mono_ms() + ACCEPT_PAUSE_MS;
            set_listening(l, 0);
        }
        return -1;
    }
    set_conn_options(fd);
    snprintf(peer, peerlen, "%s:%d", inet_ntoa(sa.sin_addr),
             ntohs(sa.sin_port));
    return fd;
}

void
listener_tick(struct listener *l, double now)
{
    if (l->paused_until && now >= l->paused_until) {
        l->paused_until = 0;
        set_listening(l, 1);
    }
}

void
listener_close(struct listener *l)
{
    if (l->fd >= 0)
        close(l->fd);
    l->fd = -1;
}
