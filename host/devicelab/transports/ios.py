"""An iPhone or iPad, chained through its Mac's SSH transport (pyinfra's `chain`): every device command becomes an
`xcrun devicectl` command line run on the Mac. A phone that is not jailbroken runs no pushed binary and has no
shell, so what the rest of devicelab asks (structured commands, the transport's operations) is done here by the
app's harness (device_payloads/harness/: llama.cpp's tools under one executable, `run`, `facts`, `sha256`, `commit`,
`fs …`) launched with `devicectl device process launch --console`, or into devicectl's own file copies and process
operations. Nothing above the transports learns it is an iPhone.

    PayloadRun (a tool under the sampler)            → harness run OUT MS ROOT -- TOOL ARGS  (then OUT/exit_code)
    KitScript facts.sh                               → harness facts WD ROOT, with devicectl's device facts
    SampleOnce                                       → one short harness run, its telemetry.csv copied to OUT
    KitScript thermal.sh                             → none (iOS says a thermal state, the harness samples it)
    run(TOOL ARGS) (a llama.cpp tool)                → harness TOOL ARGS
    sha256 / put_verified (commit) / mkdir / copy / remove / touch → harness sha256 / commit / fs …
    exists, read_text, get, get_many                 → devicectl copy from (no launch: a running app is left alone)
    kill(pid, force)                                 → devicectl device process terminate [--kill]
    alive()                                          → devicectl device info details
    commands_present(…)                              → none (an iPhone has no shell commands)

Paths on the phone are relative to the app's data container (the harness's working folder); the lab's folder
there is Documents/devicelab. A file sent to the phone goes to the Mac's verified cache first (by sha256), then
`devicectl device copy to`; the harness checks its sha256 and commits it. A launch that ends without the
harness's exit_code file is looked up in the phone's JetsamEvent reports: killed for memory is the cell's
verdict (errors.MemoryKilled), not a failure to retry."""

from __future__ import annotations

import posixpath
import re
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from .. import push
from ..errors import DevicelabError, MemoryKilled, NotMeasurable, RetryableError
from ..hashing import sha256_file
from . import devicectl
from .base import CommandResult, Commit, Platform, Transport
from .commands import Command, KitScript, PayloadRun, SampleOnce
from .devicectl import AppleDevice

WORKDIR = "Documents/devicelab"
KIT = f"{WORKDIR}/kit/"  # device_payloads' scripts: never pushed to a phone (their work is the app's)
HARNESS = "devicelab-harness"  # the app's executable: the process name jetsam reports carry

# on the Mac: run a devicectl command that writes FILE (a copy, a JSON listing), then print FILE; on failure its
# output goes to stderr and the exit status is 3
_THEN_CAT = 'f=$1; shift; rm -f "$f"; if "$@" >"$f.log" 2>&1; then cat "$f"; else cat "$f.log" >&2; exit 3; fi'


class IOSTransport(Transport):
    measures_on_host = False
    builds_before_facts = True  # `facts` is the app's: it is built and installed first
    shell = False  # no shell on the phone: the commands above are translated into the app's harness
    platform = Platform.IOS

    def __init__(
        self,
        name: str,
        mac,
        udid: str,
        bundle_id: str,
        team_id: str,
        xcode: str | None = None,
        min_os: str | None = None,
    ):
        self.name, self.mac, self.udid = name, mac, udid
        self.bundle_id, self.team_id, self.xcode, self.min_os = bundle_id, team_id, xcode, min_os
        self._info: AppleDevice | None = None
        self._incoming = False  # the container's incoming folder made this connection
        self._seen_jetsam: set[str] | None = None
        self._stage: str | None = None

    @classmethod
    def from_device(cls, d) -> "IOSTransport":
        from .ssh import SSHTransport

        if d.mac_ssh is None:
            raise DevicelabError(f"{d.name}: its Mac {d.mac!r} is not in the lab file; add it under devices: (ssh)")
        return cls(d.name, SSHTransport.from_device(d.mac_ssh), d.udid, d.bundle_id, d.team_id, d.xcode, d.min_os)

    # ---------------------------------------------------------------- what the lab asks of a device
    def workdir(self) -> str:
        return WORKDIR

    @property
    def where(self) -> str:
        """The Mac, as named in messages."""
        return f"the Mac {self.mac.name}"

    @property
    def what(self) -> str:
        d = self._info
        return f"{self.name} ({d.marketing_name or d.name or self.udid})" if d else f"{self.name} ({self.udid})"

    # ---------------------------------------------------------------- the Mac and devicectl
    def connect(self) -> None:
        try:
            self.mac.connect()
        except DevicelabError as e:
            raise RetryableError(
                f"{self.name}: its Mac {self.mac.name} is unreachable ({e}); turn the Mac on and allow Remote Login "
                "there (System Settings > General > Sharing)"
            ) from e
        problem = devicectl.state_problem(self.device_info(refresh=True), self.udid, self.where)
        if problem:
            raise DevicelabError(f"{self.name}: {problem}")
        if self._seen_jetsam is None:
            self._seen_jetsam = set(self._jetsam_reports())

    def close(self) -> None:
        self.mac.close()
        self._incoming = False

    def stage(self) -> str:
        """This device's folder on the Mac (copies on their way to and from the phone)."""
        if self._stage is None:
            self._stage = posixpath.join(self.mac.workdir(), "ios", self.udid)
        return self._stage

    def _argv(self, argv: list[str]) -> list[str]:
        return ["env", f"DEVELOPER_DIR={self.xcode}", *argv] if self.xcode else list(argv)

    def _fail(self, text: str, doing: str) -> DevicelabError:
        line = devicectl.explain(text, self.what, self.where, self.team_id, self.bundle_id)
        if line:
            return DevicelabError(f"{self.name}: {line}")
        return RetryableError(f"{self.name}: devicectl on {self.where} failed {doing}: {devicectl.first_error(text)}")

    def devicectl(self, argv: list[str], doing: str, timeout: float | None = 600) -> CommandResult:
        """A devicectl command on the Mac; a failure is one line naming its fix."""
        r = self.mac.run(self._argv(argv), timeout=timeout)
        if r.rc != 0:
            raise self._fail(r.stdout + r.stderr, doing)
        return r

    def _then_cat(self, argv: list[str], out: str, timeout: float | None = 600) -> CommandResult:
        return self.mac.run(["sh", "-c", _THEN_CAT, "devicelab", out, *self._argv(argv)], timeout=timeout)

    def devices_json(self) -> str:
        """`devicectl list devices --json-output` on the Mac, as text."""
        out = posixpath.join(self.stage(), f"devices-{secrets.token_hex(4)}.json")
        self.mac.mkdir(self.stage())
        r = self._then_cat(devicectl.list_devices(out), out, timeout=120)
        if r.rc != 0:
            raise self._fail(r.stdout + r.stderr, "listing the paired devices")
        return r.stdout

    def device_info(self, refresh: bool = False) -> AppleDevice | None:
        if refresh or self._info is None:
            self._info = devicectl.find(devicectl.parse_devices(self.devices_json()), self.udid)
        return self._info

    def install(self, app: str) -> None:
        """Install an app bundle that is on the Mac."""
        self.devicectl(devicectl.install_app(self.udid, app), f"installing {posixpath.basename(app)}", timeout=1800)

    def launch(self, args: Sequence[str], env: dict | None = None, timeout: float | None = None) -> CommandResult:
        """The app launched with `args`; waits for it to exit. Its output without devicectl's own lines. devicectl's
        failures (locked, profile not trusted, not installed, …) are one line naming the fix."""
        r = self.mac.run(self._argv(devicectl.launch(self.udid, self.bundle_id, list(args), env)), timeout=timeout)
        if r.rc != 0 and devicectl.classify(r.stdout + r.stderr):
            raise self._fail(r.stdout + r.stderr, f"launching the app ({args[0] if args else ''})")
        return CommandResult(list(args), r.rc, devicectl.app_output(r.stdout), devicectl.app_output(r.stderr))

    def _harness_ok(self, args: Sequence[str], doing: str) -> CommandResult:
        r = self.launch(args, timeout=600)
        if r.rc != 0:
            raise RetryableError(
                f"{self.name}: {doing} failed in the app (exit {r.rc}): {devicectl.first_error(r.stderr)}"
            )
        return r

    # ---------------------------------------------------------------- files
    def _copy_from(self, remote: str) -> tuple[bool, str]:
        """(copied, text): a container file onto the Mac and its text, by devicectl copy (no launch)."""
        out = posixpath.join(self.stage(), "get", secrets.token_hex(6))
        self.mac.mkdir(posixpath.dirname(out))
        r = self._then_cat(devicectl.copy_from(self.udid, self.bundle_id, remote, out), out)
        if r.rc == 0:
            return True, r.stdout
        key = devicectl.classify(r.stderr)
        if key and key != "not installed":  # the phone or the Mac is not usable: say so, never "absent"
            raise self._fail(r.stderr, f"copying {remote} from the phone")
        return False, r.stderr

    def read_text(self, remote: str) -> str | None:
        if remote.startswith("/"):  # not in the app's container (e.g. /proc/uptime): an iPhone shows none of it
            return None
        ok, text = self._copy_from(remote)
        return text if ok else None

    def exists(self, remote: str) -> bool:
        if remote.startswith(KIT):  # the kit's scripts are the app's own subcommands: it is always there
            return True
        return not remote.startswith("/") and self._copy_from(remote)[0]

    def get(self, remote: str, local: Path) -> None:
        out = posixpath.join(self.stage(), "get", secrets.token_hex(6))
        self.mac.mkdir(posixpath.dirname(out))
        r = self.mac.run(self._argv(devicectl.copy_from(self.udid, self.bundle_id, remote, out)), timeout=3600)
        if r.rc != 0:
            if devicectl.classify(r.stdout + r.stderr) not in (None, "not installed"):
                raise self._fail(r.stdout + r.stderr, f"copying {remote} from the phone")
            raise OSError(f"{remote} not readable on {self.name}")
        self.mac.get(out, local)
        self.mac.run(["rm", "-f", out])

    def get_many(self, remote_dir: str, names, local_dir: Path) -> None:
        """The files `names` of one container folder: one devicectl copy each on the Mac, in one SSH command,
        then the Mac's folder in one round trip."""
        dst = posixpath.join(self.stage(), "many", secrets.token_hex(6))
        env = {"DEVELOPER_DIR": self.xcode} if self.xcode else None
        args = [dst, remote_dir, self.udid, self.bundle_id, *names]
        self.mac.run(["sh", "-c", devicectl.COPY_FROM_EACH, "devicelab", *args], timeout=3600, env=env)
        self.mac.get_many(dst, names, local_dir)
        self.mac.run(["rm", "-rf", dst])

    def _incoming_dir(self) -> str:
        d = posixpath.join(WORKDIR, "incoming")
        if not self._incoming:
            self._harness_ok(["fs", "mkdir", d], "making the app's incoming folder")
            self._incoming = True
        return d

    def put(self, local: Path, remote: str) -> None:
        self.put_verified(local, remote)

    def put_verified(self, local: Path, remote: str, commit: Commit | None = None) -> str | None:
        """Into the Mac's verified cache (once per file), `devicectl copy to` the container's incoming folder, then
        the harness checks its sha256 and moves it into place (`commit`): one copy and one launch."""
        sha = commit.sha if commit else sha256_file(local)
        on_mac = push.ensure(self.mac, Path(local), sha, Path(local).name)
        tmp = posixpath.join(self._incoming_dir(), f"{sha[:16]}-{posixpath.basename(remote)}")
        self.devicectl(devicectl.copy_to(self.udid, self.bundle_id, on_mac, tmp), f"copying {Path(local).name} to it")
        dst, marker = (commit.dst, commit.marker) if commit else (remote, tmp + ".ok")
        self.launch(["commit", tmp, sha, dst, marker], timeout=3600)
        if self.exists(marker):  # the harness wrote it: its sha256 of the copy is ours
            return sha
        return self.sha256(tmp)

    def commit(self, remote: str, c: Commit) -> None:
        self.launch(["commit", remote, c.sha, c.dst, c.marker], timeout=3600)
        if not self.exists(c.marker):
            raise RetryableError(f"could not finish {posixpath.basename(c.dst)} on {self.name}: sha256 mismatch")

    def sha256(self, remote: str) -> str | None:
        r = self.launch(["sha256", remote], timeout=3600)
        m = re.search(r"^([0-9a-f]{64})\b", r.stdout, re.M)
        return m.group(1) if r.rc == 0 and m else None

    def mkdir(self, remote: str) -> None:
        self._harness_ok(["fs", "mkdir", remote], f"mkdir {remote}")

    # ---------------------------------------------------------------- commands
    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> CommandResult:
        """One of llama.cpp's tools, in the harness (`TOOL ARGS`, the tool by its path in a build); an iPhone runs
        nothing else by command line: the lab's other requests come as structured commands (`execute`) and the
        transport's own operations (alive, kill, remove, copy, touch, …)."""
        argv = [str(a) for a in argv]
        if cwd:
            raise DevicelabError(f"{self.name}: an iPhone's app runs in its own container (no working folder {cwd})")
        if argv and posixpath.basename(argv[0]).startswith("llama-"):
            return self.launch([posixpath.basename(argv[0]), *argv[1:]], env=env, timeout=timeout)
        raise DevicelabError(
            f"{self.name} is an iPhone/iPad: its app cannot run `{' '.join(argv[:2])[:80]}` (it runs llama.cpp's "
            "tools, a payload under its sampler, facts, sha256 and file operations)"
        )

    def execute(
        self, cmd: Command, *, timeout: float | None = None, env: dict[str, str] | None = None
    ) -> CommandResult:
        """The lab's structured commands, each as the harness does it."""
        if isinstance(cmd, PayloadRun):
            return self._run_payload(cmd, timeout, env)
        if isinstance(cmd, SampleOnce):
            return self._sample_once(cmd)
        if cmd.script == "facts.sh":
            return self._facts(cmd)
        if cmd.script == "thermal.sh":
            return CommandResult(cmd.argv(), 1, "", "no thermal zones on iOS: the app samples its thermal state")
        if cmd.script in ("cgroup.sh", "governor.sh"):
            raise DevicelabError(
                f"{self.name} is an iPhone/iPad: iOS gives an app no CPU quota or governor; drop quota/governor "
                "for it in the recipe and the lab file"
            )
        raise DevicelabError(f"{self.name} is an iPhone/iPad: its app has no {cmd.script}")

    def alive(self, timeout: float = 30) -> bool:
        return self.mac.run(self._argv(devicectl.info_details(self.udid)), timeout=timeout or 60).rc == 0

    def kill(self, pid: str, *, force: bool = False, timeout: float | None = None) -> bool:
        return self.mac.run(self._argv(devicectl.terminate(self.udid, str(pid), force)), timeout=timeout or 60).rc == 0

    def remove(self, *remote: str, timeout: float | None = None) -> None:
        self.launch(["fs", "rm", *remote], timeout=timeout or 600)

    def copy(self, src: str, dst: str) -> CommandResult:
        return self.launch(["fs", "cp", src, dst], timeout=600)

    def touch(self, remote: str, timeout: float | None = None) -> CommandResult:
        return self.launch(["fs", "touch", remote], timeout=timeout or 600)

    def commands_present(self, names: Sequence[str], timeout: float | None = None) -> set[str]:
        return set()  # an iPhone has no shell commands: its app samples what the sources would

    # ---------------------------------------------------------------- the harness's subcommands
    def _facts(self, cmd: KitScript) -> CommandResult:
        r = self.launch(["facts", *cmd.args[:2]], timeout=120)
        facts: dict[str, str] = {}
        for line in r.stdout.splitlines():
            k, sep, v = line.partition("=")
            if sep and re.fullmatch(r"[A-Za-z0-9_.]+", k.strip()):
                facts[k.strip()] = v.strip()
        d = self.device_info(refresh=True)
        if d is not None:
            facts.update(d.facts())  # devicectl knows the model, chip and iOS version; the harness its own process
        return CommandResult(cmd.argv(), r.rc, "".join(f"{k}={v}\n" for k, v in facts.items()), r.stderr)

    def _sample_once(self, cmd: SampleOnce) -> CommandResult:
        """The sampler's probe: a short harness run (its sampler writes telemetry.csv), copied to OUT."""
        folder = cmd.out + ".d"
        r = self.launch(["run", folder, "10", cmd.telemetry_root, "--", "llama-bench", "--list-devices"], timeout=120)
        self.launch(["fs", "cp", posixpath.join(folder, "telemetry.csv"), cmd.out], timeout=120)
        return CommandResult(cmd.argv(), r.rc, "", r.stderr)

    def _run_payload(self, cmd: PayloadRun, timeout, env) -> CommandResult:
        """A payload → the harness's `run`: the tool in-process under its sampler, the same files in its folder. Its
        exit status is the exit_code file's; none there means the app was ended."""
        if cmd.prefix:
            raise DevicelabError(
                f"{self.name} is an iPhone/iPad: its app runs a tool itself, not through `{' '.join(cmd.prefix)}`; "
                "drop exec_prefix from its lab entry"
            )
        if env and env.get("DEVICELAB_LIMIT_S"):
            raise DevicelabError(
                f"{self.name} is an iPhone/iPad: its app cannot stop {cmd.tool_name} at a time limit yet, so a soak "
                "payload (sustained speed) cannot run there; drop it for this device"
            )
        tool, targs = cmd.tool_name, list(cmd.args)
        if tool == "llama-server":
            targs = self._served(targs)
        r = self.launch(["run", cmd.out, str(cmd.interval_ms), cmd.telemetry_root, "--", tool, *targs], env, timeout)
        code = self.read_text(posixpath.join(cmd.out, "exit_code"))
        if code is not None and code.strip().lstrip("-").isdigit():
            return CommandResult(cmd.argv(), int(code.strip()), r.stdout, r.stderr)
        mb = self._jetsam_mb()
        if mb is not None:
            raise MemoryKilled(f"killed for memory at {mb:.0f} MB: iOS ended {tool} on {self.what} (jetsam)")
        raise RetryableError(
            f"{self.name}: the app ended before {tool} finished and no jetsam report names it "
            f"({devicectl.first_error(r.stdout + r.stderr)})"
        )

    # ---------------------------------------------------------------- jetsam
    def _jetsam_reports(self) -> list[str]:
        out = posixpath.join(self.stage(), "crash-list.json")
        try:
            self.mac.mkdir(self.stage())
            r = self._then_cat(devicectl.crash_files(self.udid, out), out, timeout=120)
        except DevicelabError:
            return []
        return devicectl.jetsam_names(r.stdout) if r.rc == 0 else []

    def _jetsam_mb(self) -> float | None:
        """The app's memory when iOS killed it, from a JetsamEvent report new since this device was connected."""
        names = self._jetsam_reports()
        new = [n for n in names if n not in (self._seen_jetsam or set())]
        self._seen_jetsam = (self._seen_jetsam or set()) | set(names)
        for name in reversed(new):
            out = posixpath.join(self.stage(), "crash", name)
            self.mac.mkdir(posixpath.dirname(out))
            r = self._then_cat(devicectl.copy_crash(self.udid, name, out), out, timeout=120)
            mb = devicectl.jetsam_footprint_mb(r.stdout, HARNESS) if r.rc == 0 else None
            if mb is not None:
                return mb
        return None

    # ---------------------------------------------------------------- llama-server through the tunnel
    def _tunnel(self) -> str:
        d = self.device_info(refresh=True)
        ip = d.reachable_tunnel if d else None
        if not ip:
            state = f"tunnelState {d.tunnel_state or 'unknown'}" if d else "not listed"
            raise NotMeasurable(
                f"{self.what} has no CoreDevice tunnel address its Mac can reach ({state}): llama-server on the "
                "phone cannot be served to this host; connect the phone by USB and keep it unlocked"
            )
        return ip

    def _served(self, targs: list[str]) -> list[str]:
        """llama-server listens on the phone's tunnel address (its loopback is the phone's alone)."""
        ip = self._tunnel()
        if "--host" in targs:
            i = targs.index("--host")
            return [*targs[: i + 1], ip, *targs[i + 2 :]]
        return [*targs, "--host", ip]

    @contextmanager
    def forward(self, remote_port: int) -> Iterator[int]:
        """A local port reaching llama-server on the phone: the Mac's SSH tunnel to the phone's CoreDevice tunnel
        address."""
        with self.mac.forward(remote_port, host=self._tunnel()) as lp:
            yield lp


def paired_lines(t: Transport, mac_name: str) -> dict[str, tuple[bool, str]]:
    """`devices probe` of a Mac: the iPhones and iPads it has paired (devicectl), each a lab entry ready to paste.
    Empty where the device is no Mac with devicectl."""
    if t.run(["sh", "-c", "command -v xcrun >/dev/null 2>&1"]).rc != 0:
        return {}
    out = posixpath.join(t.workdir(), f"devicectl-{secrets.token_hex(4)}.json")
    t.mkdir(t.workdir())
    r = t.run(["sh", "-c", _THEN_CAT, "devicelab", out, *devicectl.list_devices(out)], timeout=120)
    title = "iPhones and iPads paired with this Mac (devicectl)"
    if r.rc != 0:
        line = devicectl.explain(r.stderr, "the phone", f"the Mac {mac_name}") or devicectl.first_error(r.stderr)
        return {title: (False, line)}
    found = devicectl.phones(devicectl.parse_devices(r.stdout))
    if not found:
        return {title: (False, "none: connect one by USB, unlock it and tap Trust")}
    res = {title: (True, f"{len(found)}; paste under devices: in the lab file")}
    for d in found:
        problem = devicectl.state_problem(d, d.udid, f"the Mac {mac_name}")
        what = f"{d.marketing_name or d.product_type} iOS {d.os_version}"
        res[f"  {what}"] = (problem is None, devicectl.lab_entry(d, mac_name) + (f"  # {problem}" if problem else ""))
    return res
