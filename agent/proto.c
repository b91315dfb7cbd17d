/* proto: see proto.h. */
#include "proto.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Field types of command arguments (agent-protocol §4). */
enum ftype {
    F_NONE,
    F_NAME,        /* string matching proto_name_valid (txn, snapshot) */
    F_STRING,      /* any non-empty string (vm, disk) */
    F_MS,          /* integer 1..600000 */
    F_STRLIST,     /* non-empty array of distinct non-empty strings */
    F_SNAPMAP,     /* object: disk id -> snapshot name */
    F_OBJECT,
    F_ID,          /* integer 0..2^53 (an RBD snap id; exact in JSON) */
    F_ARGV,        /* array (maybe empty) of at most 256 strings of at most
                      4096 bytes without NUL; repeats allowed (a command's
                      arguments) */
    F_TEXT,        /* string of at most 65536 bytes without NUL (stdin) */
};

struct field {
    const char *name;
    enum ftype type;
    int required;
};

#define MAX_FIELDS 5
static const struct {
    const char *name;
    struct field fields[MAX_FIELDS];
} commands[PROTO_CMD_COUNT] = {
#define CMD(id, name, handler, roles, ...) \
    [PROTO_CMD_##id] = {name, {__VA_ARGS__}},
#include "commands.def"
#undef CMD
};

static const char *type_names[] = {
    [F_NONE] = "nothing", [F_NAME] = "a name of 1-128 [A-Za-z0-9._-]",
    [F_STRING] = "a non-empty string", [F_MS] = "an integer 1..600000",
    [F_STRLIST] = "a non-empty array of distinct non-empty strings",
    [F_SNAPMAP] = "an object of disk id to snapshot name",
    [F_OBJECT] = "an object",
    [F_ID] = "an integer 0..9007199254740992",
    [F_ARGV] = "an array of at most 256 strings of at most 4096 bytes",
    [F_TEXT] = "a string of at most 65536 bytes",
};

void
proto_error_set(struct proto_error *err, const char *code,
                const char *fmt, ...)
{
    va_list ap;

    err->code = code;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    /* Messages may quote client bytes, possibly cut mid-sequence: keep the
     * reply valid UTF-8 by replacing every non-ASCII byte. */
    for (char *p = err->message; *p; p++)
        if ((unsigned char)*p >= 0x80 || (unsigned char)*p < 0x20)
            *p = '?';
}

const char *
proto_cmd_name(enum proto_cmd cmd)
{
    if ((unsigned)cmd >= PROTO_CMD_COUNT)
        return "?";
    return commands[cmd].name;
}

int
proto_frame_check(const uint8_t *buf, size_t have, size_t *frame_len,
                  struct proto_error *err)
{
    uint32_t n;

    if (have < PROTO_HDR)
        return 0;
    n = ((uint32_t)buf[0] << 24) | ((uint32_t)buf[1] << 16) |
        ((uint32_t)buf[2] << 8) | buf[3];
    /* Size is checked before a single body byte is trusted or buffered. */
    if (n == 0 || n > PROTO_MAX_FRAME) {
        proto_error_set(err, "BAD_FRAME", "frame length %u outside 1..%u",
                        n, PROTO_MAX_FRAME);
        return -1;
    }
    if (have - PROTO_HDR < n)
        return 0;
    *frame_len = n;
    return 1;
}

int
proto_utf8_valid(const uint8_t *s, size_t len)
{
    size_t i = 0;

    while (i < len) {
        uint8_t c = s[i];
        uint32_t cp;
        size_t need, k;

        if (c == 0)
            return 0;
        if (c < 0x80) {
            i++;
            continue;
        }
        if ((c & 0xe0) == 0xc0) {
            need = 1;
            cp = c & 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            need = 2;
            cp = c & 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            need = 3;
            cp = c & 0x07;
        } else {
            return 0;
        }
        if (len - i <= need)
            return 0;
        for (k = 1; k <= need; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        /* Reject overlong forms, surrogates and code points past U+10FFFF. */
        if ((need == 1 && cp < 0x80) || (need == 2 && cp < 0x800) ||
            (need == 3 && cp < 0x10000) || cp > 0x10ffff ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += need + 1;
    }
    return 1;
}

int
proto_name_valid(const char *s)
{
    size_t n = 0;

    if (!s)
        return 0;
    for (; s[n]; n++) {
        char c = s[n];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
            return 0;
        if (n >= PROTO_MAX_NAME)
            return 0;
    }
    return n > 0;
}

static int
check_field(const struct field *f, json_t *v, struct proto_error *err)
{
    size_t i, j;
    const char *key;
    json_t *item;

    switch (f->type) {
    case F_NAME:
        if (json_is_string(v) && proto_name_valid(json_string_value(v)))
            return 0;
        break;
    case F_STRING:
        if (json_is_string(v) && json_string_length(v) > 0 &&
            json_string_length(v) <= 512 &&
            strlen(json_string_value(v)) == json_string_length(v))
            return 0;
        break;
    case F_MS:
        if (json_is_integer(v) && json_integer_value(v) >= 1 &&
            json_integer_value(v) <= 600000)
            return 0;
        break;
    case F_STRLIST:
        if (!json_is_array(v) || json_array_size(v) == 0 ||
            json_array_size(v) > 1024)
            break;
        json_array_foreach(v, i, item) {
            if (!json_is_string(item) || json_string_length(item) == 0 ||
                json_string_length(item) > 512 ||
                strlen(json_string_value(item)) != json_string_length(item))
                goto bad;
            for (j = 0; j < i; j++)
                if (json_equal(json_array_get(v, j), item))
                    goto bad;
        }
        return 0;
    case F_SNAPMAP:
        if (!json_is_object(v) || json_object_size(v) > 4096)
            break;
        json_object_foreach(v, key, item) {
            if (key[0] == '\0' || !json_is_string(item) ||
                !proto_name_valid(json_string_value(item)))
                goto bad;
        }
        return 0;
    case F_OBJECT:
        if (json_is_object(v))
            return 0;
        break;
    case F_ID:
        if (json_is_integer(v) && json_integer_value(v) >= 0 &&
            json_integer_value(v) <= 9007199254740992LL)
            return 0;
        break;
    case F_ARGV:
        if (!json_is_array(v) || json_array_size(v) > 256)
            break;
        json_array_foreach(v, i, item) {
            if (!json_is_string(item) || json_string_length(item) > 4096 ||
                strlen(json_string_value(item)) != json_string_length(item))
                goto bad;
        }
        return 0;
    case F_TEXT:
        if (json_is_string(v) && json_string_length(v) <= 65536 &&
            strlen(json_string_value(v)) == json_string_length(v))
            return 0;
        break;
    case F_NONE:
        break;
    }
bad:
    proto_error_set(err, "BAD_REQUEST", "args.%s must be %s", f->name,
                    type_names[f->type]);
    return -1;
}

static int
check_args(enum proto_cmd cmd, json_t *args, struct proto_error *err)
{
    const struct field *fields = commands[cmd].fields;
    const char *key;
    json_t *v;
    int i;

    /* Unknown keys first: a misspelt optional field must not pass silently. */
    json_object_foreach(args, key, v) {
        for (i = 0; i < MAX_FIELDS && fields[i].name; i++)
            if (strcmp(fields[i].name, key) == 0)
                break;
        if (i == MAX_FIELDS || !fields[i].name) {
            proto_error_set(err, "BAD_REQUEST", "unknown field args.%.64s "
                            "for %s", key, commands[cmd].name);
            return -1;
        }
    }
    for (i = 0; i < MAX_FIELDS && fields[i].name; i++) {
        v = json_object_get(args, fields[i].name);
        if (!v || json_is_null(v)) {
            if (fields[i].required) {
                proto_error_set(err, "BAD_REQUEST", "missing args.%s (%s)",
                                fields[i].name, type_names[fields[i].type]);
                return -1;
            }
            continue;
        }
        if (check_field(&fields[i], v, err) < 0)
            return -1;
    }
    return 0;
}

int
proto_parse_request(const uint8_t *body, size_t len, struct proto_request *req,
                    int *bad_frame, struct proto_error *err)
{
    json_error_t jerr;
    json_t *root = NULL, *id, *cmd, *args;
    const char *key;
    json_t *v;
    int i;

    memset(req, 0, sizeof(*req));
    *bad_frame = 0;
    if (len == 0 || len > PROTO_MAX_FRAME) {
        proto_error_set(err, "BAD_FRAME", "frame length %zu outside 1..%u",
                        len, PROTO_MAX_FRAME);
        goto frame;
    }
    if (!proto_utf8_valid(body, len)) {
        proto_error_set(err, "BAD_FRAME", "frame is not valid UTF-8 "
                        "(or contains NUL)");
        goto frame;
    }
    root = json_loadb((const char *)body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        proto_error_set(err, "BAD_FRAME", "invalid JSON at byte %d: %.100s",
                        jerr.position, jerr.text);
        goto frame;
    }
    if (!json_is_object(root)) {
        proto_error_set(err, "BAD_FRAME", "frame is JSON but not an object");
        goto frame;
    }
    id = json_object_get(root, "id");
    if (!id || !(json_is_integer(id) ||
                 (json_is_string(id) && json_string_length(id) <= 128))) {
        proto_error_set(err, "BAD_REQUEST", "id must be an integer or a "
                        "string of at most 128 bytes");
        goto fail;
    }
    req->id = json_incref(id);
    json_object_foreach(root, key, v) {
        if (strcmp(key, "id") && strcmp(key, "cmd") && strcmp(key, "args")) {
            proto_error_set(err, "BAD_REQUEST", "unknown request field "
                            "%.64s", key);
            goto fail;
        }
    }
    cmd = json_object_get(root, "cmd");
    if (!json_is_string(cmd)) {
        proto_error_set(err, "BAD_REQUEST", "cmd must be a string");
        goto fail;
    }
    for (i = 0; i < PROTO_CMD_COUNT; i++)
        if (strcmp(commands[i].name, json_string_value(cmd)) == 0)
            break;
    if (i == PROTO_CMD_COUNT) {
        proto_error_set(err, "UNKNOWN_COMMAND", "unknown command %.64s",
                        json_string_value(cmd));
        goto fail;
    }
    req->cmd = (enum proto_cmd)i;
    args = json_object_get(root, "args");
    if (args && !json_is_object(args)) {
        proto_error_set(err, "BAD_REQUEST", "args must be an object");
        goto fail;
    }
    if (!args) {
        args = json_object();
        if (!args || json_object_set_new(root, "args", args) < 0) {
            proto_error_set(err, "INTERNAL", "out of memory");
            goto fail;
        }
    }
    if (check_args(req->cmd, args, err) < 0)
        goto fail;
    req->root = root;
    req->args = args;
    return 0;

frame:
    *bad_frame = 1;
fail:
    json_decref(root);
    req->root = NULL;
    req->args = NULL;
    return -1;
}

void
proto_request_clear(struct proto_request *req)
{
    if (!req)
        return;
    json_decref(req->id);
    json_decref(req->root);
    memset(req, 0, sizeof(*req));
}

static uint8_t *
encode(json_t *obj, size_t *len)
{
    char *s = NULL;
    uint8_t *out = NULL;
    size_t n;

    s = json_dumps(obj, JSON_COMPACT);
    if (!s)
        goto cleanup;
    n = strlen(s);
    out = malloc(n + PROTO_HDR);
    if (!out)
        goto cleanup;
    out[0] = (uint8_t)(n >> 24);
    out[1] = (uint8_t)(n >> 16);
    out[2] = (uint8_t)(n >> 8);
    out[3] = (uint8_t)n;
    memcpy(out + PROTO_HDR, s, n);
    *len = n + PROTO_HDR;
cleanup:
    free(s);
    return out;
}

uint8_t *
proto_reply_ok(json_t *id, json_t *result, size_t *len)
{
    json_t *o = json_pack("{s:O?,s:b,s:o}", "id", id, "ok", 1, "result",
                          result ? result : json_object());
    uint8_t *out;

    if (!o)
        return NULL;
    out = encode(o, len);
    json_decref(o);
    return out;
}

uint8_t *
proto_reply_err(json_t *id, const char *code, const char *message,
                json_t *result, size_t *len)
{
    json_t *o = json_pack("{s:O?,s:b,s:{s:s,s:s}}", "id", id, "ok", 0,
                          "error", "code", code, "message", message);
    uint8_t *out;

    if (!o) {
        json_decref(result);
        return NULL;
    }
    if (result)
        json_object_set_new(o, "result", result);
    out = encode(o, len);
    json_decref(o);
    return out;
}
