"""The paper recipe's small variant on this machine: thread sweep 1→2, a quota of half a core (a real
cgroup), a co-running load, parallel streams, the roofline payload; then roofline and findings."""

import glob

import pytest

from conftest import REPO, devicelab

pytestmark = pytest.mark.e2e
RECIPE = REPO / "recipes" / "paper-x86-small.yaml"


@pytest.fixture(scope="module")
def lab(tmp_path_factory, host_build, smol_path):
    d = tmp_path_factory.mktemp("paper")
    p = devicelab("run", RECIPE, "--lab-dir", d)
    assert p.returncode == 0, p.stdout + p.stderr
    return d


def rows(d):
    from devicelab.ledger import Ledger
    return Ledger(d / "ledger.sqlite").rows_frame()


def test_sweep_axes_land_in_the_schema(lab):
    r = rows(lab)
    dec = r[r.metric == "decode_tps"]
    assert set(dec.threads) == {1, 2}
    assert set(dec.contention.dropna()) >= {1}
    from devicelab.ledger import Ledger
    cells = Ledger(lab / "ledger.sqlite").cells()
    quota_cells = [c for c in cells if '"quota": 0.5' in c["params"]]
    assert len(quota_cells) == 3
    if quota_cells[0]["status"] == "skipped":
        assert "CPU quota not available" in quota_cells[0]["error"]
        pytest.skip("this machine lets nobody set a CPU quota: " + quota_cells[0]["error"])
    assert (dec.cpu_quota.dropna() == 0.5).sum() == 3
    assert not glob.glob("/sys/fs/cgroup/*/devicelab-*") and not glob.glob("/sys/fs/cgroup/devicelab-*"), \
        "the lab removes the cgroups it made"


def test_quota_run_is_measurably_slower(lab):
    r = rows(lab)
    dec = r[(r.metric == "decode_tps") & (r.threads == 1)]
    if dec.cpu_quota.notna().sum() == 0:
        pytest.skip("no quota cells ran here")
    free = dec[dec.cpu_quota.isna() & (dec.contention.fillna(0) == 0)].groupby("quant").value.max()
    capped = dec[dec.cpu_quota == 0.5].groupby("quant").value.max()
    ratio = (capped / free).median()
    assert ratio < 0.8, f"half a core should cost well over 20% of one-thread decode, got ×{ratio:.2f}"


def test_roofline_payload_and_efficiency(lab):
    r = rows(lab)
    bw = r[r.metric == "mem_bandwidth"].value
    fl = r[r.metric == "peak_flops"].value
    assert len(bw) == 1 and 1e9 < bw.iloc[0] < 1e12
    assert 1e9 < fl.iloc[0] < 1e14
    p = devicelab("roofline", "--lab-dir", lab, check=True)
    body = [l for l in p.stdout.splitlines() if "smollm2" in l]
    assert len(body) == 3 * 4 * 2            # 3 quants × 4 bench cells × (pp, tg)
    assert all("%" in l for l in body)
    assert all(l.rstrip(" │").endswith("memory") for l in body if "tg32" in l)
    assert all(l.rstrip(" │").endswith("compute") for l in body if "pp64" in l)


def test_parallel_streams(lab):
    r = rows(lab)
    agg = r[r.metric == "aggregate_tps"]
    assert set(agg.n_parallel) == {1, 2, 4}
    by = agg.groupby("n_parallel").value.median()
    assert by[4] > by[1], "aggregate throughput grows with concurrent sequences"


def test_findings_printed(lab):
    p = devicelab("findings", "--lab-dir", lab, check=True)
    for claim in ("decode t/s falls as bits per weight rise", "adding cores speeds prefill",
                  "quality collapses below", "a CPU quota of 0.5 cores slows decode: held"):
        assert claim in p.stdout, p.stdout
