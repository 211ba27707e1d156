/* exit() as the harness sees it. llama.cpp's tools call exit() themselves (bad arguments, --help, fatal
 * errors); under `devicelab-harness run` the tool runs in this process, so its exit status must still reach
 * OUTDIR/exit_code, after the last telemetry tick and the tool's last output line. A definition of exit() in
 * the executable takes the calls of the code linked into it (llama.cpp is linked statically); it lets the
 * harness finish the run, then hands over to the C library's exit(). Compiled with -fno-builtin. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_NEXT */
#endif
#include <dlfcn.h>
#include <unistd.h>

void devicelab_before_exit(int status); /* harness.cpp: finishes a `run` in progress (once) */

typedef void (*devicelab_exit_fn)(int);

__attribute__((noreturn)) void exit(int status) {
    devicelab_before_exit(status);
    devicelab_exit_fn real = (devicelab_exit_fn) dlsym(RTLD_NEXT, "exit");
    if (real) {
        real(status);
    }
    _exit(status);
}
