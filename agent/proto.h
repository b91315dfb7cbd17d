/*
 * proto: frames and requests of the agent protocol (docs/agent-protocol.md
 * §2, §3).  Pure functions, no I/O, so that the unit tests and the libFuzzer
 * target exercise exactly what the server runs.
 *
 * Order of checks (agent-protocol §3.2): frame size → UTF-8 → JSON object →
 * id → cmd → known cmd → args.  The first failure is the reply.
 */
#ifndef CP_PROTO_H
#define CP_PROTO_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#define PROTO_MAX_FRAME 1048576u   /* agent-protocol §2.2 */
#define PROTO_HDR 4
#define PROTO_MAX_NAME 128         /* txn, snapshot and id string limit */

/* The commands, from the command table (commands.def). */
enum proto_cmd {
#define CMD(id, ...) PROTO_CMD_##id,
#include "commands.def"
#undef CMD
    PROTO_CMD_COUNT
};

struct proto_error {
    const char *code;       /* static string, e.g. "BAD_REQUEST" */
    char message[256];
};

struct proto_request {
    json_t *root;           /* owned: the whole parsed object */
    json_t *id;             /* borrowed from root (int or string) */
    enum proto_cmd cmd;
    json_t *args;           /* borrowed from root, or an owned empty object */
};

/*
 * Inspects the start of a receive buffer.  Returns 1 and sets *frame_len
 * (body length) when a whole frame is present, 0 when more bytes are
 * needed, -1 (BAD_FRAME in err) when the header announces 0 or more than
 * PROTO_MAX_FRAME bytes; the caller must then reply and close.
 */
int proto_frame_check(const uint8_t *buf, size_t have, size_t *frame_len,
                      struct proto_error *err);

/* Returns 1 when buf[0..len) is valid UTF-8 without NUL bytes, else 0. */
int proto_utf8_valid(const uint8_t *buf, size_t len);

/*
 * Parses and validates one frame body.  Returns 0 and fills req (release
 * with proto_request_clear), or -1 with err filled.  On -1, *bad_frame is
 * set to 1 when the connection must be closed (BAD_FRAME), and req->id may
 * still hold the request id (a new reference, or NULL) for the reply.
 */
int proto_parse_request(const uint8_t *body, size_t len,
                        struct proto_request *req, int *bad_frame,
                        struct proto_error *err);

void proto_request_clear(struct proto_request *req);

const char *proto_cmd_name(enum proto_cmd cmd);

/* 1 when s is 1..PROTO_MAX_NAME bytes of [A-Za-z0-9._-]. */
int proto_name_valid(const char *s);

/*
 * Builds a reply frame (header + JSON) in a malloc'd buffer, *len set.
 * Steals the references to result.  id may be NULL (sent as null).
 */
uint8_t *proto_reply_ok(json_t *id, json_t *result, size_t *len);
uint8_t *proto_reply_err(json_t *id, const char *code, const char *message,
                         json_t *result, size_t *len);

void proto_error_set(struct proto_error *err, const char *code,
                     const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
