/* par: see par.h. */
#include "par.h"

#include <pthread.h>

#include "config.h"

void
par_run(par_fn fn, void *items, size_t size, int n)
{
    pthread_t th[CFG_MAX_VMS];
    int started[CFG_MAX_VMS] = {0};

    if (n == 1) {
        fn(items);
        return;
    }
    for (int i = 0; i < n && i < CFG_MAX_VMS; i++)
        started[i] = pthread_create(&th[i], NULL, fn,
                                    (char *)items + (size_t)i * size) == 0;
    for (int i = 0; i < n && i < CFG_MAX_VMS; i++) {
        if (started[i])
            pthread_join(th[i], NULL);
        else
            fn((char *)items + (size_t)i * size);
    }
}

void
par_detach(par_fn fn, void *arg)
{
    pthread_t th;
    pthread_attr_t at;

    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &at, fn, arg) != 0)
        fn(arg);    /* no thread: do it here, late rather than never */
    pthread_attr_destroy(&at);
}
