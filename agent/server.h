/*
 * server: the TLS 1.3 mutual-auth listener (agent-protocol §1, §2).
 * One epoll loop owns every socket and SSL object; each valid request runs
 * in its own thread (dispatch_run) and posts its reply frame back to the
 * loop through a queue and an eventfd, so a request that waits on a slow
 * VM never blocks other connections or other requests on the same one.
 *
 * Connection states, one handler each in server.c:
 *
 *   accept ──▶ HANDSHAKE ──SSL_accept ok (client cert verified)──▶ OPEN
 *                  │ fails (no/untrusted cert, not TLS 1.3)        │
 *                  ▼                                               │ BAD_FRAME
 *               closed ◀──── peer EOF / I/O error ──── CLOSING ◀───┘
 *                                 (flush the pending replies, then close)
 */
#ifndef CP_SERVER_H
#define CP_SERVER_H

#include <signal.h>
#include <stddef.h>

#include "agent.h"

/* Runs until *stop becomes non-zero.  0 on a clean stop, -1 on setup
 * failure (err). */
int server_run(struct agent *a, volatile sig_atomic_t *stop, char *err,
               size_t errlen);

#endif
