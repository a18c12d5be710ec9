// For the WebAssembly build of dev/memory_planner (dev/memory_page/build.py): wasi-libc has no
// setjmp. llmc/utils.h's every_rank_alike uses it to catch a rank's fail(); the planner, one
// process, never does, so fail() never jumps: setjmp says "first return", longjmp cannot happen.
#ifndef MEMORY_PAGE_SETJMP_H
#define MEMORY_PAGE_SETJMP_H
typedef int jmp_buf[1];
static inline int setjmp(jmp_buf env) {
    (void)env;
    return 0;
}
static inline void longjmp(jmp_buf env, int value) {
    (void)env;
    (void)value;
    __builtin_trap();  // (unreachable in the planner: nothing sets llmc_catch)
}
#endif
