/* ring.c - TCP token ring between writers (see ring.h). */
#include "ring.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void put_le(unsigned char *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_le(const unsigned char *p, int n)
{
    uint64_t v = 0;

    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

void ring_msg_encode(const struct ring_msg *m, unsigned char *buf)
{
    memcpy(buf, "CPTK", 4);
    put_le(buf + 4, m->type, 4);
    put_le(buf + 8, m->run, 8);
    put_le(buf + 16, m->seq, 8);
}

int ring_msg_decode(const unsigned char *buf, struct ring_msg *m)
{
    if (memcmp(buf, "CPTK", 4) != 0)
        return -1;
    m->type = (uint32_t)get_le(buf + 4, 4);
    m->run = get_le(buf + 8, 8);
    m->seq = get_le(buf + 16, 8);
    if (m->type < RING_TOKEN || m->type > RING_COUNT)
        return -1;
    return 0;
}

static void fill_addr(struct sockaddr_in *sa, uint32_t addr, uint16_t port)
{
    memset(sa, 0, sizeof(*sa));
    sa->sin_family = AF_INET;
    sa->sin_addr.s_addr = addr;
    sa->sin_port = htons(port);
}

static int listen_on(struct ring *r, uint16_t port, char *err, size_t errlen)
{
    struct sockaddr_in sa;
    int one = 1;

    r->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (r->listen_fd < 0) {
        set_err(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    setsockopt(r->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    /* Any address: in a guest eth0 carries CP_IP; on the host the test
     * gives every writer its own port on 127.0.0.1. */
    fill_addr(&sa, htonl(INADDR_ANY), port);
    if (bind(r->listen_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
        listen(r->listen_fd, 4) < 0) {
        set_err(err, errlen, "listen on port %u: %s", port, strerror(errno));
        return -1;
    }
    return 0;
}

/* Connect to the next node, retrying while it is not up yet. */
static int connect_next(struct ring *r, const struct config *cfg,
                        double deadline, char *err, size_t errlen)
{
    int next = (r->index + 1) % r->n;
    struct sockaddr_in sa;
    int one = 1;
    int last = 0;

    fill_addr(&sa, cfg->peers[next].addr, config_peer_port(cfg, next));
    while (now_s() < deadline) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

        if (fd < 0) {
            set_err(err, errlen, "socket: %s", strerror(errno));
            return -1;
        }
        if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
            /* One small message per record: never wait for Nagle. */
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            r->next_fd = fd;
            return 0;
        }
        last = errno;
        close(fd);
        if (last != ECONNREFUSED && last != ENETUNREACH &&
            last != EHOSTUNREACH && last != ETIMEDOUT && last != EINTR)
            break;
        usleep(200 * 1000);
    }
    set_err(err, errlen, "connect to next writer %s:%u: %s",
            cfg->peers[next].host, config_peer_port(cfg, next),
            last ? strerror(last) : "timed out");
    return -1;
}

static int accept_prev(struct ring *r, double deadline,
                       char *err, size_t errlen)
{
    struct pollfd pfd = { .fd = r->listen_fd, .events = POLLIN };

    for (;;) {
        double left = deadline - now_s();
        int rc;

        if (left <= 0) {
            set_err(err, errlen, "no connection from the previous writer");
            return -1;
        }
        rc = poll(&pfd, 1, (int)(left * 1000) + 1);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc < 0) {
            set_err(err, errlen, "poll: %s", strerror(errno));
            return -1;
        }
        if (rc == 0)
            continue;
        r->prev_fd = accept4(r->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (r->prev_fd >= 0)
            return 0;
        if (errno != EINTR && errno != ECONNABORTED) {
            set_err(err, errlen, "accept: %s", strerror(errno));
            return -1;
        }
    }
}

int ring_connect(struct ring *r, const struct config *cfg,
                 char *err, size_t errlen)
{
    double deadline = now_s() + cfg->connect_timeout_s;

    r->listen_fd = r->next_fd = r->prev_fd = -1;
    r->index = cfg->ring_index;
    r->n = cfg->npeers;
    if (listen_on(r, config_peer_port(cfg, r->index), err, errlen) < 0)
        goto cleanup;
    if (connect_next(r, cfg, deadline, err, errlen) < 0)
        goto cleanup;
    if (accept_prev(r, deadline, err, errlen) < 0)
        goto cleanup;
    close(r->listen_fd);
    r->listen_fd = -1;
    return 0;

cleanup:
    ring_close(r);
    return -1;
}

int ring_send(struct ring *r, const struct ring_msg *m,
              char *err, size_t errlen)
{
    unsigned char buf[RING_MSG_SIZE];
    size_t off = 0;

    ring_msg_encode(m, buf);
    while (off < sizeof(buf)) {
        ssize_t n = send(r->next_fd, buf + off, sizeof(buf) - off,
                         MSG_NOSIGNAL);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            set_err(err, errlen, "send to next writer: %s",
                    n < 0 ? strerror(errno) : "closed");
            return -1;
        }
        off += (size_t)n;
    }
    return 0;
}

int ring_recv(struct ring *r, struct ring_msg *m, char *err, size_t errlen)
{
    unsigned char buf[RING_MSG_SIZE];
    size_t off = 0;

    while (off < sizeof(buf)) {
        ssize_t n = recv(r->prev_fd, buf + off, sizeof(buf) - off, 0);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            set_err(err, errlen, "receive from previous writer: %s",
                    strerror(errno));
            return -1;
        }
        if (n == 0) {
            set_err(err, errlen, "previous writer closed the ring");
            return -1;
        }
        off += (size_t)n;
    }
    if (ring_msg_decode(buf, m) < 0) {
        set_err(err, errlen, "bad ring message from previous writer");
        return -1;
    }
    return 0;
}

void ring_close(struct ring *r)
{
    if (!r)
        return;
    if (r->listen_fd >= 0)
        close(r->listen_fd);
    if (r->next_fd >= 0)
        close(r->next_fd);
    if (r->prev_fd >= 0)
        close(r->prev_fd);
    r->listen_fd = r->next_fd = r->prev_fd = -1;
}
