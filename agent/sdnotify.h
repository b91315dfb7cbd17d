/*
 * sdnotify: systemd's readiness and watchdog notifications, without
 * libsystemd.  The protocol is one datagram of "KEY=VALUE\n..." text to
 * the AF_UNIX socket named by $NOTIFY_SOCKET (a path, or "@name" for an
 * abstract socket); outside systemd the variable is unset and every call
 * is a no-op.
 *
 *   READY=1      sent once recovery is done and the agent serves
 *   WATCHDOG=1   sent by the reaper, every half of $WATCHDOG_USEC: a
 *                reaper that stops (and with it the lease guard) gets the
 *                agent restarted, and the restart resumes what it paused
 */
#ifndef CP_SDNOTIFY_H
#define CP_SDNOTIFY_H

/* Sends msg; 0 when sent, 1 when $NOTIFY_SOCKET is unset, -1 on error. */
int sdnotify_send(const char *msg);
/* The watchdog ping interval in ms (half of $WATCHDOG_USEC), or 0 when
 * systemd asks for no watchdog pings from this process ($WATCHDOG_PID
 * names another one, or the variable is unset or invalid). */
double sdnotify_watchdog_ms(void);

#endif
