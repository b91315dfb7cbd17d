/*
 * server: the TLS 1.3 mutual-auth listener (agent-protocol §1, §2).
 * One epoll loop owns every socket and SSL object.  Each valid request that
 * authz allows (the peer's role, the deny-list) runs on one of the pool's
 * threads (dispatch_run) and posts its reply frame back to the loop
 * (replyq.h), so a request that waits on a slow VM never blocks other
 * connections or other requests on the same one.  Limits (§1.7): at most
 * [agent] max_connections connections, a handshake deadline, TCP
 * keepalive on every connection.
 *
 * Connection states, one handler each in server.c:
 *
 *   accept ──▶ HANDSHAKE ──SSL_accept ok (client cert verified)──▶ OPEN
 *                  │ fails (no/untrusted/revoked cert, not TLS 1.3, │
 *                  │ handshake_timeout_ms)                          │
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
