"""Where devicelab keeps its caches (sources, builds, models) and lab data (ledger, artifacts)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path


def home() -> Path:
    """Cache root: $DEVICELAB_HOME, else ~/.cache/devicelab."""
    p = os.environ.get("DEVICELAB_HOME")
    root = Path(p).expanduser() if p else Path.home() / ".cache" / "devicelab"
    root.mkdir(parents=True, exist_ok=True)
    return root


def sub(name: str) -> Path:
    d = home() / name
    d.mkdir(parents=True, exist_ok=True)
    return d


def device_payloads_dir() -> Path:
    """The device-side scripts shipped beside the package (repo root / device_payloads)."""
    env = os.environ.get("DEVICELAB_PAYLOADS")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for parent in here.parents:
        cand = parent / "device_payloads"
        if (cand / "sampler.sh").exists():
            return cand
    raise FileNotFoundError("device_payloads/ not found; set DEVICELAB_PAYLOADS to the repo's device_payloads folder")


@contextmanager
def result_lock(out: Path):
    """Held while one process makes the file `out` (a lock file beside it): a second process that wants the same
    result waits, then finds it made. Several results in one folder are made at once."""
    import fcntl

    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def flock(fh, mode: int, cancel=None, what: str = "a lock") -> None:
    """fcntl.flock(fh, mode), waiting; where `cancel` (a threading.Event) is given, a wait it ends raises
    RetryableError instead of blocking a stopping run (Ctrl-C while another run holds what this one waits for)."""
    import fcntl

    if cancel is None:
        fcntl.flock(fh, mode)
        return
    while True:
        try:
            fcntl.flock(fh, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if cancel.wait(0.1):
                from .errors import RetryableError

                raise RetryableError(f"interrupted while waiting for {what}") from None


def lock_holders(fh) -> list[int]:
    """The other processes that hold a flock on the open file `fh`, from /proc/locks; [] where the
    system does not say."""
    st = os.fstat(fh.fileno())
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    pids = {int(f[4]) for f in (ln.split() for ln in lines if "->" not in ln) if len(f) > 5 and f[5] == dev}
    return sorted(pids - {os.getpid()})


def describe_pid(pid: int) -> str:
    """`pid 123 (devicelab run a.yaml)`: a process named for a message, its command line where it can be read."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return f"pid {pid}"
    words = [a.decode(errors="replace") for a in argv if a]
    text = " ".join([Path(words[0]).name, *words[1:]])[:80] if words else ""
    return f"pid {pid} ({text})" if text else f"pid {pid}"


def temp_for(out: Path) -> Path:
    """A temporary name beside `out` that no other process or thread uses (renamed into place when complete)."""
    import uuid

    return out.parent / f".{out.stem}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp{out.suffix}"
