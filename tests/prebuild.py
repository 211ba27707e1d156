"""The suite's llama.cpp builds, made in the background while the tests that need none run.

Each distinct build the suite uses is made once (the build cache under DEVICELAB_HOME, keyed by what makes the
build), by the same calls the tests and the lab make, so a test that wants a build this process is still making
waits on the build's own lock file and then finds it. The process runs at the lowest priority, so it takes only the
CPU the tests leave idle, and it stops (SIGSTOP, its compilers with it) while a lab measurement holds this host's
CPUs (the exclusive flock on DEVICELAB_HOME/locks/host-cpus.lock that every measurement on the local host takes),
so no measurement of the suite runs beside one of its compilers.

    python3 tests/prebuild.py host aarch64 harness opencl vulkan   (conftest starts it; any subset)

A build that fails here is left to the test that needs it: that test makes it again and fails with the reason."""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from pathlib import Path

AARCH64_FEATURES = {"fp", "asimd", "asimddp"}  # the suite's boards and phone peer (test_aarch64 FEATURES)
# what a lab run builds for a bench and KLD recipe on a device built here (runner/session.py Builds._with_tools):
# the Vulkan and OpenCL tests run no other tool
LAB_VARIANT_TOOLS = ("llama-bench", "llama-perplexity")


@functools.cache
def _source():
    from devicelab.build import source

    return source.resolve(None)


def host():
    from devicelab.build import cache, targets

    return cache.ensure(_source(), targets.local_native(), jobs=2)


def aarch64():
    from devicelab.build import cache, targets

    return cache.ensure(_source(), targets.aarch64_cross_static(AARCH64_FEATURES), jobs=2)


def harness():
    from devicelab.build import harness as h

    return h.ensure_linux(_source(), jobs=2)


def opencl():
    from devicelab.build import backends, cache, targets

    tgt = backends.variant(targets.local_native(), "opencl")
    return cache.ensure(_source(), tgt, tools=LAB_VARIANT_TOOLS, jobs=2)


def vulkan():
    from devicelab.build import backends, cache, targets

    tgt = backends.variant(targets.local_native(), "vulkan", dict(os.environ))
    return cache.ensure(_source(), tgt, tools=LAB_VARIANT_TOOLS, jobs=2)


BUILDS = {f.__name__: f for f in (host, aarch64, harness, opencl, vulkan)}


def measuring(lock: Path) -> bool:
    """Whether a process holds an exclusive flock on `lock` (a measurement), read from /proc/locks: reading it
    takes no lock, so a measurement that starts never waits on this check."""
    try:
        st = lock.stat()
        text = Path("/proc/locks").read_text()
    except OSError:
        return False
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 6 and f[1] == "FLOCK" and f[3] == "WRITE" and f[4] != "->":
            dev_ino = f[5].split(":")
            if len(dev_ino) == 3 and int(dev_ino[2]) == st.st_ino:
                return True
    return False


class Stops:
    """Seconds a measurement held this host's CPUs, and seconds the compilers were stopped for one, so far."""

    def __init__(self) -> None:
        self.measured = 0.0
        self.stopped = 0.0


def pause_while_measuring(lock: Path, stop: threading.Event, stops: Stops) -> None:
    """Stop this process's compilers while a measurement holds the host's CPUs; let them go on when it ends; count
    both in `stops`."""
    import psutil

    me = psutil.Process()
    stopped: list = []
    last = time.monotonic()
    while not stop.wait(0.1):
        now = measuring(lock)
        t = time.monotonic()
        if now:
            stops.measured += t - last
        if stopped:
            stops.stopped += t - last
        last = t
        if now and not stopped:
            stopped = me.children(recursive=True)
            for p in stopped:
                try:
                    p.suspend()
                except psutil.Error:
                    pass
        elif stopped and not now:
            for p in stopped:
                try:
                    p.resume()
                except psutil.Error:
                    pass
            stopped = []


def lowest_priority() -> None:
    """Nice 19, and the same for this process's autogroup where the kernel groups by session
    (kernel.sched_autogroup_enabled): there a process's nice value ranks it only inside its own group, and a group
    gets as much CPU as the suite's however nice its processes are (measured here: two niced busy loops in a new
    session doubled the time of a two-process job beside them; the same loops with their group's nice at 19 cost
    it 8 %)."""
    os.nice(19)
    try:
        Path("/proc/self/autogroup").write_text("19")
    except OSError:  # no autogroups in this kernel, or not allowed: the nice value above is what counts
        pass


def main(names: list[str]) -> int:
    from devicelab import paths

    lowest_priority()
    stop = threading.Event()
    lock = paths.sub("locks") / "host-cpus.lock"
    lock.touch()
    stops = Stops()
    threading.Thread(target=pause_while_measuring, args=(lock, stop, stops), daemon=True).start()
    start = time.time()
    for name in names:
        t0, s0 = time.time(), stops.stopped
        try:
            BUILDS[name]()
            said = f"ready in {time.time() - t0:.0f} s"
        except Exception as e:  # the test that needs it makes it again and says why
            said = f"failed after {time.time() - t0:.0f} s: {e}"
        said += f" ({stops.stopped - s0:.0f} s of it stopped beside the suite's measurements)"
        print(f"prebuild {name}: {said}, {time.time() - start:.0f} s after the suite's start", flush=True)
    print(
        f"prebuild: measurements held this host's CPUs {stops.measured:.0f} s of the {time.time() - start:.0f} s"
        " the builds took",
        flush=True,
    )
    stop.set()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
