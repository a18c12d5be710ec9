// Declarations only, for the WebAssembly build of dev/memory_planner (dev/memory_page/build.sh):
// wasi-libc has no threads, and the planner never starts one (the watchdog, which does, is the
// trainers'). The trainers' headers still name these types and calls.
#ifndef MEMORY_PAGE_PTHREAD_H
#define MEMORY_PAGE_PTHREAD_H
typedef int pthread_t;
typedef int pthread_attr_t;
typedef int pthread_mutex_t;
typedef int pthread_cond_t;
#define PTHREAD_MUTEX_INITIALIZER 0
#define PTHREAD_COND_INITIALIZER 0
int pthread_create(pthread_t* thread, const pthread_attr_t* attr, void* (*run)(void*), void* arg);
int pthread_join(pthread_t thread, void** result);
int pthread_detach(pthread_t thread);
int pthread_mutex_lock(pthread_mutex_t* mutex);
int pthread_mutex_unlock(pthread_mutex_t* mutex);
int pthread_cond_wait(pthread_cond_t* cond, pthread_mutex_t* mutex);
int pthread_cond_signal(pthread_cond_t* cond);
int pthread_cond_broadcast(pthread_cond_t* cond);
#endif
