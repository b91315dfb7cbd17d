/*
 * libFuzzer target: the input is a byte stream as read from a connection.
 * It is cut into frames exactly as the server does, each body is parsed
 * and validated, and a reply is encoded for it.
 */
#include <stdint.h>
#include <stdlib.h>

#include "proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t off = 0, n, len;
    struct proto_error err;
    struct proto_request req;
    uint8_t *reply;
    int bad;

    while (off < size) {
        int r = proto_frame_check(data + off, size - off, &n, &err);
        if (r <= 0) {
            /* 0: truncated frame, wait for more; -1: BAD_FRAME then close.
             * Also parse the remainder as a body, to fuzz the parser on
             * inputs that do not start with a plausible header. */
            if (proto_parse_request(data + off, size - off, &req, &bad,
                                    &err) == 0)
                proto_request_clear(&req);
            else
                proto_request_clear(&req);
            break;
        }
        if (proto_parse_request(data + off + PROTO_HDR, n, &req, &bad,
                                &err) == 0) {
            reply = proto_reply_ok(req.id, NULL, &len);
        } else {
            reply = proto_reply_err(req.id, err.code, err.message, NULL,
                                    &len);
            if (!reply)
                abort();   /* every error must be encodable */
        }
        free(reply);
        proto_request_clear(&req);
        if (bad)
            break;
        off += PROTO_HDR + n;
    }
    return 0;
}
