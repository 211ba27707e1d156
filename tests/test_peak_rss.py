"""The sampler's peak RSS of a real llama-bench agrees with /usr/bin/time -v within 5%."""

import re
import subprocess
from pathlib import Path

import pytest

from devicelab import paths
from devicelab.models.ladder import Ladder
from devicelab.telemetry import normalize, sampler_csv

pytestmark = pytest.mark.e2e


@pytest.mark.skipif(not Path("/usr/bin/time").exists(), reason="needs GNU time (Debian package 'time')")
def test_peak_rss_matches_gnu_time(tmp_path, host_build, smol_path):
    model = Ladder("smollm2-135m", smol_path, host_build.tool("llama-quantize")).quant("q8_0").path
    argv = [
        str(host_build.tool("llama-bench")),
        "-m",
        str(model),
        "-p",
        "32",
        "-n",
        "16",
        "-r",
        "2",
        "-t",
        "2",
        "-o",
        "jsonl",
    ]
    out = tmp_path / "cell"
    subprocess.run(
        ["sh", str(paths.device_payloads_dir() / "run_payload.sh"), str(out), "100", "/", "--", *argv], check=True
    )
    tr = sampler_csv.parse((out / "telemetry.csv").read_text())
    rows = {r.metric: r for r in normalize.summarize(tr, [], None).rows}
    sampled = rows["peak_rss"].value
    t = subprocess.run(["/usr/bin/time", "-v", *argv], capture_output=True, text=True, check=True)
    kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", t.stderr).group(1))
    assert sampled == pytest.approx(kb * 1024, rel=0.05), (sampled, kb * 1024)
