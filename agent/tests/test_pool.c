/*
 * cmocka tests of the request pool (pool.h): never more threads at once
 * than workers, a full queue refuses at once, and stop runs what was
 * queued before it joins.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "pool.h"

static atomic_int running, most, done;
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cond = PTHREAD_COND_INITIALIZER;
static int gate_open;

static void
job(void *arg)
{
    int now = atomic_fetch_add(&running, 1) + 1, m = atomic_load(&most);

    (void)arg;
    while (now > m && !atomic_compare_exchange_weak(&most, &m, now))
        ;
    pthread_mutex_lock(&gate_mu);
    while (!gate_open)
        pthread_cond_wait(&gate_cond, &gate_mu);
    pthread_mutex_unlock(&gate_mu);
    atomic_fetch_sub(&running, 1);
    atomic_fetch_add(&done, 1);
}

static void
test_bounded_threads_and_queue(void **state)
{
    struct pool p;
    int accepted = 0;

    (void)state;
    assert_int_equal(pool_start(&p, 2, 3), 0);
    /* 2 running + 3 waiting; the rest is refused while the gate is shut */
    for (int i = 0; i < 10; i++) {
        if (pool_submit(&p, job, NULL) == 0)
            accepted++;
        usleep(20000);      /* let a worker take the item it was given */
    }
    assert_int_equal(accepted, 5);
    assert_int_equal(atomic_load(&running), 2);
    pthread_mutex_lock(&gate_mu);
    gate_open = 1;
    pthread_cond_broadcast(&gate_cond);
    pthread_mutex_unlock(&gate_mu);
    pool_stop(&p);
    assert_int_equal(atomic_load(&done), 5);
    assert_int_equal(atomic_load(&most), 2);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bounded_threads_and_queue),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
