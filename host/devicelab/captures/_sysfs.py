"""A sysfs capture as a file tree the device-side scripts can read (their ROOT argument), and the sampler run
over it: a capture of /sys as people publish it becomes what the sampler on that device would have read.

Two textual forms are accepted, as they appear in bug reports and other projects' fixtures:
- `grep . FILES` / `grep -r . DIR` output: one `PATH:VALUE` line per file (absolute paths under /sys or /proc);
- a power_supply `uevent` (`POWER_SUPPLY_CURRENT_NOW=…` lines): written as the files of `folder`."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

from .. import facts, paths
from ..telemetry import sampler_csv

# a colon inside the path is one followed by more of the path (intel-rapl:0:1/…, soc:qcom,gpubw/…); the first
# other colon ends it (values may hold colons: modalias:of:N…)
_GREP = re.compile(r"^(?P<path>/(?:sys|proc)/(?:[^:]|:(?=[^/=\s]+/))+):(?P<value>.*)$")


def grep_files(text: str) -> dict[str, str]:
    """{absolute path: value} from `grep . FILES` output (later lines of one path are joined by newlines)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _GREP.match(line.rstrip("\r"))
        if m:
            p = m["path"]
            out[p] = out[p] + "\n" + m["value"] if p in out else m["value"]
    return out


def uevent_files(text: str, folder: str) -> dict[str, str]:
    """{absolute path: value} for a power_supply uevent: POWER_SUPPLY_X=v is the attribute file `x` of `folder`."""
    out = {}
    for line in text.splitlines():
        k, sep, v = line.strip().partition("=")
        if sep and k.startswith("POWER_SUPPLY_"):
            out[f"{folder.rstrip('/')}/{k[len('POWER_SUPPLY_') :].lower()}"] = v
    return out


def write_tree(files: dict[str, str], root: Path) -> Path:
    """Write {absolute path: value} under root (each value a file's content, newline-terminated)."""
    for p, v in files.items():
        f = root / p.lstrip("/")
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(v + "\n")
    return root


def sample(files: dict[str, str], ticks: int = 3, interval_ms: int = 20) -> sampler_csv.SamplerTrace:
    """Run the lab's own sampler (device_payloads/sampler.sh) over the tree for a few ticks and parse its CSV,
    as the host does with a device's: every tick reads the same captured values."""
    with tempfile.TemporaryDirectory(prefix="devicelab-capture-") as d:
        root = write_tree(files, Path(d) / "root")
        out = Path(d) / "telemetry.csv"
        subprocess.run(
            ["sh", str(paths.device_payloads_dir() / "sampler.sh"), "-o", str(out), "-R", str(root),
             "-i", str(interval_ms), "-T", str(interval_ms), "-n", str(ticks), "-S"],
            check=True, timeout=60, capture_output=True,
        )  # fmt: skip
        return sampler_csv.parse(out.read_text())


def run_script(script: str, files: dict[str, str], *args: str, tools: dict[str, str] | None = None) -> str:
    """Run a device-side script (device_payloads/SCRIPT) with the tree as its ROOT (its last argument); `tools`
    ({name: sh script}) are stand-ins first on PATH, answering as the device's own commands did in a capture (test
    doubles fed a real capture)."""
    with tempfile.TemporaryDirectory(prefix="devicelab-capture-") as d:
        root = write_tree(files, Path(d) / "root")
        env = None
        if tools:
            bin_ = Path(d) / "bin"
            bin_.mkdir()
            for name, text in tools.items():
                (bin_ / name).write_text(text)
                (bin_ / name).chmod(0o755)
            env = dict(os.environ, PATH=f"{bin_}{os.pathsep}{os.environ.get('PATH', '')}")
        r = subprocess.run(
            ["sh", str(paths.device_payloads_dir() / script), *args, str(root)],
            check=True, timeout=60, capture_output=True, text=True, env=env,
        )  # fmt: skip
        return r.stdout


def device_facts(files: dict[str, str], tools: dict[str, str] | None = None) -> dict:
    """The facts the lab takes at first contact (device_payloads/facts.sh, facts.parse) over the tree, with `tools`
    as in run_script; its work folder a temporary one."""
    with tempfile.TemporaryDirectory(prefix="devicelab-facts-") as wd:
        return facts.parse(run_script("facts.sh", files, str(Path(wd) / "work"), tools=tools), "capture")
