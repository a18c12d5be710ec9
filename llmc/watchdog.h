// A watchdog for jobs that stop moving. A collective waits for every rank of its group, so one
// stopped peer (SIGSTOP, a hung device, a lost node) leaves all the others waiting forever, and
// nothing fails that could end the job. With -watchdog SECONDS a thread per rank watches a
// heartbeat: the trainer marks each phase of a step (and each micro-batch, each sampled token),
// the comm layer each collective it enters and leaves, file I/O every 64 MB. When nothing has
// been marked for SECONDS, the thread prints the rank, the step and the operation it waits in,
// and exits the process non-zero; mpirun then ends the rest.
// A rank waiting for a peer sees no progress of its own, so SECONDS must exceed the slowest
// thing any rank does between two collectives: one micro-batch's forward and backward, a
// sample, rank 0's write of the model file. Off (0) by default; on in the tests.
#ifndef LLMC_WATCHDOG_H
#define LLMC_WATCHDOG_H

#include <pthread.h>
#include "utils.h"

typedef struct {
    double timeout_s;
    long long last_progress_ms;  // written by the training thread, read by the watchdog thread
    const char* phase;           // what the trainer is doing, e.g. "forward and backward"
    const char* op;              // the collective being waited in, or NULL
    const char* group;
    int step;
} Watchdog;

static Watchdog llmc_watchdog;

static inline long long watchdog_now_ms(void) { return (long long)(wall_time_s() * 1e3); }

// every field goes through atomic loads and stores: the two threads share them without a lock
static inline void watchdog_beat(void) {
    __atomic_store_n(&llmc_watchdog.last_progress_ms, watchdog_now_ms(), __ATOMIC_RELEASE);
}

static inline void watchdog_phase(const char* phase, int step) {
    __atomic_store_n(&llmc_watchdog.phase, phase, __ATOMIC_RELAXED);
    __atomic_store_n(&llmc_watchdog.step, step, __ATOMIC_RELAXED);
    watchdog_beat();
}

static inline void watchdog_enter(const char* op, const char* group) {
    __atomic_store_n(&llmc_watchdog.group, group, __ATOMIC_RELAXED);
    __atomic_store_n(&llmc_watchdog.op, op, __ATOMIC_RELAXED);
    watchdog_beat();
}

static inline void watchdog_leave(void) {
    __atomic_store_n(&llmc_watchdog.op, (const char*)NULL, __ATOMIC_RELAXED);
    watchdog_beat();
}

static inline void* watchdog_thread(void* unused) {
    (void)unused;
    for (;;) {
        struct timespec pause = {0, 200 * 1000 * 1000};
        nanosleep(&pause, NULL);
        long long idle = watchdog_now_ms() - __atomic_load_n(&llmc_watchdog.last_progress_ms, __ATOMIC_ACQUIRE);
        if (idle < llmc_watchdog.timeout_s * 1e3) continue;
        const char* op = __atomic_load_n(&llmc_watchdog.op, __ATOMIC_RELAXED);
        const char* group = __atomic_load_n(&llmc_watchdog.group, __ATOMIC_RELAXED);
        const char* phase = __atomic_load_n(&llmc_watchdog.phase, __ATOMIC_RELAXED);
        int step = __atomic_load_n(&llmc_watchdog.step, __ATOMIC_RELAXED);
        if (op) {
            fprintf(stderr, "[rank %d] error: watchdog: no progress for %.0f s at step %d (%s): "
                    "waiting in %s on group '%s', a peer rank is stopped or hung; ending the job\n",
                    llmc_rank, idle / 1e3, step, phase, op, group);
        } else {
            fprintf(stderr, "[rank %d] error: watchdog: no progress for %.0f s at step %d in %s; "
                    "ending the job\n", llmc_rank, idle / 1e3, step, phase);
        }
        fflush(stderr);
        // not MPI_Abort: another thread is inside MPI. mpirun ends the job when a rank exits
        _exit(1);
    }
    return NULL;
}

// seconds <= 0: no watchdog
static inline void watchdog_start(double seconds) {
    if (seconds <= 0) return;
    llmc_watchdog.timeout_s = seconds;
    watchdog_phase("start-up", 0);
    llmc_progress_hook = watchdog_beat;
    pthread_t thread;
    if (pthread_create(&thread, NULL, watchdog_thread, NULL) != 0) fail("cannot start the watchdog thread");
    pthread_detach(thread);
}

#endif
