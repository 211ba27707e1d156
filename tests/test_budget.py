"""Memory budgets from the device, the phone rule against the published phone guidance, relative quality bars,
per-task picks, energy per prompt and the minimum-RAM table.

The published table's cases go through the recommendation itself (rows → candidates → the RAM line), with the
real shapes of Llama-3.2-1B and -3B. The device sources are read by the real device_payloads/facts.sh: this
machine's /proc/meminfo; a fixture sysfs tree for a phone's low-memory killer and battery; and, for the Mac
(none can run here), stand-ins for vm_stat, memory_pressure and ioreg on PATH that print those tools' real
output formats."""

import math
import shutil
import stat
from pathlib import Path

import pandas as pd
import pytest
from conftest import FIXTURES, REPO

from devicelab import budget
from devicelab.facts import collect
from devicelab.models.gguf_info import ModelInfo
from devicelab.recipes import RecommendSpec
from devicelab.recommend import recommend
from devicelab.schema import ROW_COLUMNS
from devicelab.transports.local import LocalTransport

GB = 1e9
# Llama-3.2-1B / -3B (their published config.json): layers, KV heads, head dim; and the published GGUF files'
# sizes (bartowski's Llama-3.2-{1B,3B}-Instruct-GGUF)
SHAPES = {"1B": (16, 8, 64), "3B": (28, 8, 128)}
FILES = {
    ("1B", "q4_k_m"): 0.808 * GB,
    ("1B", "q5_k_m"): 0.912 * GB,
    ("1B", "q8_0"): 1.32 * GB,
    ("3B", "q4_k_m"): 2.02 * GB,
    ("3B", "q5_k_m"): 2.32 * GB,
    ("3B", "q8_0"): 3.42 * GB,
}
# the published guidance: the smallest phone (GB of RAM) for each model and quant
GUIDANCE = {
    ("1B", "q4_k_m"): 4,
    ("3B", "q4_k_m"): 6,
    ("1B", "q5_k_m"): 6,
    ("3B", "q5_k_m"): 8,
    ("1B", "q8_0"): 8,
    ("3B", "q8_0"): 12,
}
# MemTotal of real phones of each marketed size (the kernel sees less than is fitted)
MEMTOTAL_KB = {4: 3_764_920, 6: 5_722_384, 8: 7_713_004, 12: 11_534_112}


def kv_per_token(m):
    n_layer, n_kv, hd = SHAPES[m]
    return ModelInfo("x", 0, "llama", m, 1, None, n_layer, None, None, n_kv, hd, hd, None, None).kv_cache_bytes(1)


def row(**kw):
    r = {c: None for c in ROW_COLUMNS}
    r.update(kw)
    return r


def test_the_phone_rule_against_the_published_guidance():
    """Every (model, quant, phone) cell of the guidance through the recommendation's RAM line: the phone's budget
    from its MemTotal by the phone rule, the need from the file, the KV cache at 2048 tokens and llama.cpp's
    runtime (unmeasured here: the recommendation's default)."""
    rows = []
    for gb, kb in MEMTOTAL_KB.items():
        b = budget.from_facts({"android.model": "x", "mem.total_kB": str(kb), "mem_total_bytes": kb * 1024})
        assert b.source == "phone rule" and f"a {gb} GB phone" in b.detail
        for (m, q), size in FILES.items():
            for metric, v in (("decode_tps", 10.0), ("kld_mean", 0.01)):
                rows.append(
                    row(
                        device=f"{gb}gb",
                        model=m,
                        quant=q,
                        metric=metric,
                        value=v,
                        phase="decode",
                        model_bytes=int(size),
                        bpw=8 * size / 1.2e9,
                        kv_bytes_per_token=kv_per_token(m),
                        ram_budget_bytes=b.bytes,
                        ram_budget_source=b.line(),
                    )
                )
    recs = recommend(pd.DataFrame(rows), RecommendSpec(context=2048))
    fits = {
        (c.model, c.quant, int(r.device[:-2])): not any(f.startswith("needs") for f in c.failures)
        for r in recs
        for c in r.candidates
    }
    assert len(fits) == 24
    disagree = {k for k, f in fits.items() if f != (k[2] >= GUIDANCE[k[:2]])}
    # the one cell no rule that follows memory need can meet: the guidance puts 3B Q4_K_M on 6 GB phones and
    # 1B Q8_0 only on 8 GB ones, though the first needs more memory than the second
    need = {(c.model, c.quant): c.ram_need for c in recs[0].candidates}
    assert need[("3B", "q4_k_m")] > need[("1B", "q8_0")]
    assert disagree == {("1B", "q8_0", 6)}
    # and the minimum-RAM table says the same, cell by cell
    table = {(t["model"], t["quant"]): t["phone_gb"] for t in recs[0].min_ram}
    assert table == {**GUIDANCE, ("1B", "q8_0"): 6}
    # a RAM line names the budget's source
    no = next(c for c in recs[0].candidates if (c.model, c.quant) == ("3B", "q4_k_m"))
    assert "budget" in no.verdict and "phone rule: a 4 GB phone" in no.verdict


def test_linux_memavailable_at_idle(tmp_path):
    t = LocalTransport("board", root=str(tmp_path / "wd"))
    f = collect(t, str(REPO / "device_payloads"), str(tmp_path / "none"))
    b = budget.from_facts(f)
    have = {ln.split(":")[0]: int(ln.split()[1]) * 1024 for ln in Path("/proc/meminfo").read_text().splitlines()}
    assert b.source == "MemAvailable"
    assert abs(b.bytes - have["MemAvailable"]) < 0.1 * have["MemTotal"]
    assert budget.from_facts(f, override=3 * 1024**3) == budget.Budget(
        3 * 1024**3, "lab file", "ram_budget_bytes 3.00 GiB"
    )
    assert budget.battery(f) == (None, "no battery capacity readable")


def test_phone_lmk_threshold_and_battery_from_a_fixture_tree(tmp_path):
    root = tmp_path / "sysfs"
    lmk = root / "sys/module/lowmemorykiller/parameters"
    lmk.mkdir(parents=True)
    (lmk / "minfree").write_text("18432,23040,27648,32256,55296,80640\n")
    bat = root / "sys/class/power_supply/battery"
    bat.mkdir(parents=True)
    for k, v in {"type": "Battery", "charge_full": "4410000", "voltage_now": "3912000"}.items():
        (bat / k).write_text(v + "\n")
    t = LocalTransport("phone", root=str(tmp_path / "wd"))
    f = collect(t, str(REPO / "device_payloads"), str(root))
    assert f["mem.lmk_minfree"] == "18432,23040,27648,32256,55296,80640"
    f["android.model"] = "Peer 7"  # this machine is no phone: its facts say so
    b = budget.from_facts(f)
    have = {ln.split(":")[0]: int(ln.split()[1]) * 1024 for ln in Path("/proc/meminfo").read_text().splitlines()}
    assert b.source == "MemAvailable" and "foreground threshold 72 MiB" in b.detail
    assert abs(b.bytes - (have["MemAvailable"] - 18432 * 4096)) < 0.1 * have["MemTotal"]
    wh, how = budget.battery(f)
    assert wh == pytest.approx(4.41 * 3.912) and how == "charge_full 4410 mAh × 3.91 V (voltage now)"


def _standin(d, name, text):
    p = d / name
    p.write_text(f"#!/bin/sh\ncat <<'EOF'\n{text}EOF\n")
    p.chmod(p.stat().st_mode | stat.S_IEXEC)


@pytest.mark.skipif(not shutil.which("dash"), reason="needs dash")
def test_mac_vm_stat_memory_pressure_and_battery(tmp_path):
    """No Mac here: stand-ins print vm_stat's, memory_pressure's and ioreg's real formats."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    _standin(bin_, "vm_stat", (FIXTURES / "snapshots/vm_stat.txt").read_text())
    _standin(bin_, "memory_pressure", "System-wide memory free percentage: 61%\n")
    _standin(bin_, "ioreg", (FIXTURES / "snapshots/ioreg-AppleSmartBattery.txt").read_text())
    t = LocalTransport("mac", root=str(tmp_path / "wd"))
    import os

    old = os.environ["PATH"]
    os.environ["PATH"] = f"{bin_}:{old}"
    try:
        f = collect(t, str(REPO / "device_payloads"), str(tmp_path / "none"))
    finally:
        os.environ["PATH"] = old
    b = budget.from_facts(f)
    assert b.source == "vm_stat" and b.bytes == (21385 + 327187 + 4612 + 17456) * 16384
    assert f["mem.free_percent"] == "61"
    del f["mem.vm_stat"]
    b = budget.from_facts(f)
    assert b.source == "memory_pressure" and b.bytes == int(f["mem_total_bytes"] * 0.61)
    wh, how = budget.battery(f)
    assert wh == pytest.approx(4.843 * 12.739) and "AppleRawMaxCapacity 4843 mAh" in how


def test_dumpsys_meminfo_free_ram():
    text = (FIXTURES / "snapshots/dumpsys-meminfo.txt").read_text()
    assert budget.dumpsys_free_kb(text) == 3_503_356
    b = budget.from_facts(
        {
            "android.model": "x",
            "mem.available_kB": "2000000",
            "mem.dumpsys_free": " Free RAM: 3,503,356K (  380,348K cached pss + …)",
        }
    )
    assert b.source == "dumpsys meminfo" and b.bytes == 3_503_356 * 1024


def test_meminfo_fallback_says_why():
    """Older releases print 'Free RAM: N kB (' (read: tests/fixtures/real/dumpsys-meminfo); where no Free RAM can be
    read, the budget falls back to MemAvailable and says why."""
    assert budget.dumpsys_free_kb(" Free RAM: 1182598 kB (59686 cached pss + 326668 cached + 796244 free)") == 1182598
    phone = {"android.model": "x", "mem.available_kB": "2000000"}
    for extra, why in (
        ({}, "no dumpsys meminfo reading"),
        ({"mem.dumpsys_free": ""}, "printed no Free RAM line"),
        ({"mem.dumpsys_free": " Free RAM: unknown"}, "not understood: 'Free RAM: unknown'"),
    ):
        b = budget.from_facts({**phone, **extra})
        assert b.source == "MemAvailable" and b.bytes == 2_000_000 * 1024
        assert "fallback: " in b.detail and why in b.detail, b.detail


def _cands(quant_acc: dict, tasks=("easy", "hard"), energy=True):
    """One device, one model, a ladder with per-task accuracies (None: not measured)."""
    rows = []
    for q, accs in quant_acc.items():
        size = {"f16": 270e6, "q8_0": 145e6, "q4_0": 80e6, "q2_k": 60e6}[q]
        common = dict(
            device="phone",
            model="m",
            quant=q,
            model_bytes=int(size),
            bpw=8 * size / 135e6,
            kv_bytes_per_token=1000,
            ram_budget_bytes=2 * 1024**3,
            ram_budget_source="MemAvailable: x",
            battery_wh=17.0,
            battery_source="energy_full 17.00 Wh",
            threads=2,
        )
        rows.append(row(metric="decode_tps", value=20.0, phase="decode", n_gen=64, **common))
        rows.append(row(metric="kld_mean", value=0.01, phase="", **common))
        if energy:
            cal = '{"source": "battery:battery", "current_unit": "uA", "current_sign": -1.0}'
            rows.append(
                row(
                    metric="energy_per_token",
                    value=0.5,
                    phase="prefill",
                    n_prompt=512,
                    energy_calibration=cal,
                    **common,
                )
            )
            rows.append(
                row(metric="energy_per_token", value=2.0, phase="decode", n_gen=64, energy_calibration=cal, **common)
            )
        for t, a in zip(tasks, accs, strict=True):
            if a is not None:
                rows.append(row(metric="accuracy", value=a, phase="eval", test=t, **common))
    return pd.DataFrame(rows)


def test_relative_bar_per_task_picks_and_energy_per_prompt():
    rows = _cands({"f16": (0.90, 0.80), "q8_0": (0.90, 0.79), "q4_0": (0.89, 0.70), "q2_k": (0.60, 0.40)})
    spec = RecommendSpec(context=512, max_accuracy_drop=2, prefer="smallest")
    (r,) = recommend(rows, spec)
    c = {c.quant: c for c in r.candidates}
    assert r.pick.quant == "q8_0"  # q4_0 loses 10 points on the hard task
    assert "hard: accuracy 70.0% is 10.0 points below the base's 80.0% (> 2)" in c["q4_0"].failures
    assert not c["q8_0"].failures and not c["f16"].failures
    # per task: the easy task ships q4_0, the hard one q8_0
    assert r.per_task["easy"]["pick"] == "m q4_0" and r.per_task["hard"]["pick"] == "m q8_0"
    assert r.per_task["easy"]["base_accuracy"] == 0.90
    # energy of one prompt of the lab's shape: 512 prompt tokens × 0.5 J + 64 generated × 2 J
    assert c["q8_0"].prompt_shape == "pp512+tg64"
    assert c["q8_0"].wh_per_prompt == pytest.approx((512 * 0.5 + 64 * 2.0) / 3600)
    assert c["q8_0"].battery_per_1000 == pytest.approx(1000 * (384 / 3600) / 17.0)
    assert "battery:battery" in c["q8_0"].energy_source and "energy_full 17.00 Wh" in c["q8_0"].energy_source
    spec2 = RecommendSpec(context=512, prompt_tokens=100, gen_tokens=10)
    c2 = {c.quant: c for c in recommend(rows, spec2)[0].candidates}
    assert c2["q4_0"].wh_per_prompt == pytest.approx((100 * 0.5 + 10 * 2.0) / 3600)


def test_a_quant_whose_base_was_never_measured_is_not_judged():
    rows = _cands({"q8_0": (0.90, 0.80), "q4_0": (0.90, 0.80)}, energy=False)
    (r,) = recommend(rows, RecommendSpec(context=512, max_accuracy_drop=2))
    assert r.pick is None
    for c in r.candidates:
        assert any(f.startswith("not judged on easy: the unquantized base") for f in c.failures)
        assert c.wh_per_prompt is None and c.battery_per_1000 is None
    # the base measured on one task only: the other is still not judged
    rows = _cands({"f16": (0.90, None), "q4_0": (0.90, 0.80)}, energy=False)
    (r,) = recommend(rows, RecommendSpec(context=512, max_accuracy_drop=2))
    q4 = next(c for c in r.candidates if c.quant == "q4_0")
    assert [f for f in q4.failures if "not judged" in f] == [
        "not judged on hard: the unquantized base (f32/bf16/f16) was never measured on this task on this device: "
        "add f16 to the recipe's quants"
    ]


def test_budget_rule_numbers():
    assert [round(budget.phone_rule(g) / 1024**3, 2) for g in (4, 6, 8, 12)] == [0.94, 2.19, 3.44, 5.94]
    assert budget.ram_class_gb(3.6 * 1024**3) == 4 and budget.ram_class_gb(7.4 * 1024**3) == 8
    assert not math.isnan(budget.laptop_rule(16, 0.75))
