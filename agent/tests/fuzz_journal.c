/*
 * libFuzzer target: the input is a journal file's bytes, parsed as a
 * restarted agent parses them (either format).  Every entry it yields
 * is of a known kind (paused, frozen, redirect) and its fields are proper,
 * non-empty C strings of their size.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "journal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct journal_entry *e = NULL;
    int n = 0;

    if (journal_parse((const char *)data, size, &e, &n) < 0)
        return 0;
    for (int i = 0; i < n; i++) {
        if (e[i].kind != JOURNAL_PAUSED && e[i].kind != JOURNAL_FROZEN &&
            e[i].kind != JOURNAL_REDIRECT)
            abort();
        if (strnlen(e[i].txn, sizeof(e[i].txn)) == sizeof(e[i].txn) ||
            strnlen(e[i].vm, sizeof(e[i].vm)) == sizeof(e[i].vm) ||
            !e[i].txn[0] || !e[i].vm[0])
            abort();
    }
    free(e);
    return 0;
}
