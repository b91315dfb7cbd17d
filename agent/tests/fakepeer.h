/*
 * fakepeer: what the replay peers of test_qmp.c and test_qga.c share.
 * Each test plays the far end of a socketpair from recorded replies; both
 * read the client's requests one line at a time and check that the
 * request names the command the recording expects.
 */
#ifndef FAKEPEER_H
#define FAKEPEER_H

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

#endif
