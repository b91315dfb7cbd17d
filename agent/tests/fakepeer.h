/*
 * fakepeer: what the replay peers of test_qmp.c and test_qga.c share.
 * Each test plays the far end of a socketpair from recorded replies; both
 * read the client's requests one line at a time and check that the
 * request names the command the recording expects.
 */
#ifndef FAKEPEER_H
#define FAKEPEER_H

#include <pthread.h>
#include <stddef.h>
#include <jansson.h>

/*
 * Reads one '\n'-terminated line from fd into buf (without the '\n',
 * NUL-terminated; a longer line is cut at cap - 1 bytes).  Byte by byte,
 * so that nothing after the line is consumed.  Returns 0, or -1 on EOF or
 * a read error.
 */
int fakepeer_read_line(int fd, char *buf, size_t cap);

/*
 * 1 if got and want are both requests with the same "execute" string,
 * else 0 (also when either is NULL or has no "execute").
 */
int fakepeer_same_execute(const json_t *got, const json_t *want);

/*
 * A QEMU monitor replayed from recordings (tests/qmp-replies/NAME.txt, made
 * by tests/record_qmp.py).  A fixture line "> {...}" is a request the
 * client must send (its "execute" is checked, and with strict_args its
 * "arguments" too); "< {...}" is sent verbatim, except that a reply's "id"
 * is replaced by the id of the last request, as QEMU echoes ids.
 */
struct fakepeer_qmp {
    int fd;                 /* the peer's end of the socketpair */
    char *lines[64];
    int n;
    int chunk;              /* >0: send replies in pieces of this size */
    int hang_after;         /* stop replying after this many requests (-1 off) */
    int strict_args;        /* 1: a request's arguments must match too */
    int mismatches;
    pthread_t th;
};

/*
 * Loads the fixtures (NULL-terminated names, from $QMP_FIXTURES), makes a
 * socketpair and starts the peer on one end in a thread.  Returns the
 * client's end of the socketpair.
 */
int fakepeer_qmp_start(struct fakepeer_qmp *r, const char **files, int chunk,
                       int hang_after);
/* Waits for the peer (the client's end must be closed first) and frees. */
void fakepeer_qmp_finish(struct fakepeer_qmp *r);

#endif
