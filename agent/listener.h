/*
 * listener: the agent's listening TCP socket (agent-protocol §1.7).  It
 * owns the bind, the accept loop's back-off when the process runs out of
 * file descriptors, and the options every accepted connection gets
 * (TCP_NODELAY, keepalive), so that server.c deals only in connections.
 */
#ifndef CP_LISTENER_H
#define CP_LISTENER_H

#include <stddef.h>

struct listener {
    int fd;                 /* -1 until listener_open */
    int efd;                /* the epoll set it is registered in */
    double paused_until;    /* 0, or when to listen again (mono ms) */
};

/* Binds addr:port (IPv4) and adds the socket to epoll set efd with
 * data.ptr = l.  0, or -1 with err. */
int listener_open(struct listener *l, int efd, const char *addr, int port,
                  char *err, size_t errlen);

/* One pending connection: its non-blocking fd (options set) and its
 * "addr:port" in peer, or -1 when none is left.  On EMFILE/ENFILE it stops
 * listening for 100 ms (the pending connection stays queued and the socket
 * readable: without a pause the loop would spin). */
int listener_accept(struct listener *l, char *peer, size_t peerlen);

/* Listens again once a pause is over; called on every loop turn. */
void listener_tick(struct listener *l, double now);

void listener_close(struct listener *l);

#endif
