"""The paper recipe's small variant on this machine: thread sweep 1→2, a quota of half a core (a real
cgroup), a co-running load, parallel streams, the roofline payload; then roofline and findings."""

import glob

import pytest
from conftest import REPO, devicelab

from devicelab.ledger import ledger_path

pytestmark = [pytest.mark.e2e, pytest.mark.speeds]  # it judges speeds measured here: nothing beside it (conftest.py)
RECIPE = REPO / "recipes" / "paper-x86-small.yaml"


@pytest.fixture(scope="module")
def lab(tmp_path_factory, host_build, smol_path):
    d = tmp_path_factory.mktemp("paper")
    p = devicelab("run", RECIPE, "--lab-dir", d)
    assert p.returncode == 0, p.stdout + p.stderr
    return d


def rows(d):
    from devicelab.ledger import Ledger

    return Ledger(ledger_path(d)).rows_frame()


def test_sweep_axes_land_in_the_schema(lab):
    r = rows(lab)
    dec = r[r.metric == "decode_tps"]
    assert set(dec.threads) == {1, 2}
    assert set(dec.contention.dropna()) >= {1}
    from devicelab.ledger import Ledger

    cells = Ledger(ledger_path(lab)).cells()
    quota_cells = [c for c in cells if '"quota": 0.5' in c["params"]]
    assert len(quota_cells) == 3
    if quota_cells[0]["status"] == "skipped":
        assert "CPU quota not available" in quota_cells[0]["error"]
        pytest.skip("this machine lets nobody set a CPU quota: " + quota_cells[0]["error"])
    assert (dec.cpu_quota.dropna() == 0.5).sum() == 3
    assert not glob.glob("/sys/fs/cgroup/*/devicelab-*") and not glob.glob("/sys/fs/cgroup/devicelab-*"), (
        "the lab removes the cgroups it made"
    )


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
    assert len(body) == 3 * 4 * 2  # 3 quants × 4 bench cells × (pp, tg)
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
    for claim in (
        "decode t/s falls as bits per weight rise",
        "adding cores speeds prefill",
        "quality collapses below",
        "a CPU quota of 0.5 cores slows decode: held",
    ):
        assert claim in p.stdout, p.stdout


# A phone's facts as facts.sh writes them (cpu.max_khz 'ID:kHz', in the shell's glob order, which puts
# cpu10 before cpu2): 4 little cores at 1.8 GHz, 3 big at 2.4 GHz, 1 prime at 3.0 GHz, plus 2 more little
# ones numbered 8 and 9 on a 10-core part. Not a phone: the facts line of one.
PHONE = {
    "cpu.max_khz": "0:1800000 1:1800000 10:1800000 2:1800000 3:1800000 4:2400000 5:2400000 6:2400000 "
    "7:3000000 8:1800000 9:1800000",
    "cpu_count": 11,
}


def test_big_little_masks_from_cpufreq_clusters():
    from devicelab import facts

    assert [k for k, _ in facts.clusters(PHONE)] == [3000000, 2400000, 1800000]
    assert facts.named_cpus("prime", PHONE) == [7]
    assert facts.named_cpus("big", PHONE) == [4, 5, 6, 7]
    assert facts.named_cpus("little", PHONE) == [0, 1, 2, 3, 8, 9, 10]
    assert facts.mask_hex(facts.named_cpus("big", PHONE)) == "0xf0"
    assert facts.named_cpus("all", PHONE) == list(range(11))
    uniform = {"cpu.max_khz": "0:2000000 1:2000000", "cpu_count": 2}
    assert facts.named_cpus("big", uniform) is None and facts.named_cpus("all", uniform) == [0, 1]
    assert facts.named_cpus("big", {"cpu_count": 2}) is None and facts.named_cpus("all", {"cpu_count": 2}) == [0, 1]


def test_named_mask_on_a_machine_without_clusters_is_skipped_with_the_reason(tmp_path, host_build, smol_path):
    """This VM has no cpufreq: 'big' means nothing here, and the cell says so instead of guessing;
    'all' with threads 'auto' still runs (every CPU, one thread each)."""
    r = tmp_path / "r.yaml"
    r.write_text(
        "name: masks\nmodels: [{name: smollm2-135m}]\nquants: [q4_0]\npayloads:\n"
        "  - {kind: bench, prompt: [8], gen: [4], threads: [auto], cpu_masks: [big, all], repetitions: 1}\n"
    )
    p = devicelab("run", r, "--lab-dir", tmp_path / "lab")
    assert p.returncode == 0, p.stdout + p.stderr
    from devicelab.ledger import Ledger

    led = Ledger(ledger_path(tmp_path / "lab"))
    skipped = [c for c in led.cells() if c["status"] == "skipped"]
    assert len(skipped) == 1 and "no big.LITTLE clusters to pick 'big'" in skipped[0]["error"]
    rows = led.rows_frame()
    dec = rows[rows.metric == "decode_tps"]
    import os

    assert len(dec) == 1 and dec.cpu_mask.iloc[0] == f"all={hex((1 << os.cpu_count()) - 1)}"
    assert int(dec.threads.iloc[0]) == os.cpu_count()


def test_bad_cpu_mask_is_one_line(tmp_path):
    r = tmp_path / "r.yaml"
    r.write_text("name: m\npayloads:\n  - {kind: bench, cpu_masks: [biggest]}\n")
    p = devicelab("run", r, "--lab-dir", tmp_path / "lab")
    assert p.returncode != 0 and "prime | big | little | all" in p.stderr and len(p.stderr.strip().splitlines()) == 1
