"""Two sides of the lab's rows side by side — two llama.cpp commits, two backends, two devices, two runs, two
models — paired on the properties that make two rows comparable, with a significance test over the stored
repetitions — or over the runs, where each side has two or more — so run noise is never reported as a change.

A side is a set of `key=value` filters on what rows carry (`commit=0c1e570`, `backend=vulkan`, `device=pixel-8`,
`run=20261204T…`, `model=base-lora`), optionally over another lab folder or an exported table (`lab=DIR`,
`from=FILE`). Rows pair on their kind's key properties (kinds/base.py: compare-llama-bench's KEY_PROPERTIES)
minus the properties the sides differ in. Per pair: both means, B/A, Welch's t over the repetitions, the
p-values adjusted for the number of pairs (Holm), and a verdict from the metric's direction in the schema: a
change counts only when it is significant *and* at least `min_effect` in size.

Repetitions measure the noise within a run, not between runs: a pair a side of which was measured on this host's
CPUs while other processes kept `max_busy` CPUs or more busy (rows' `host_busy_cpus`) is not judged — its verdict
says the host was busy, with both figures, instead of calling a difference the load made a change. Where a side
holds one run, the repetitions cannot know the noise between runs; the ledger can, where it holds the same
figure (same build, same cell properties) from two runs or more outside the two sides: `run_noise` pools that
scatter per device and metric, and a one-run difference smaller than what two runs of one build differ by 95 % of
the time is not called a change: Student's t at the history's degrees of freedom × √2 × the between-run sd
(`noise_z`). The degrees of freedom are counted in runs (each build's runs less one), not in the keys the scatter
is pooled over: what moves a run moves all its keys, so a history of two runs knows the between-run noise as
poorly as one difference can (t = 12.7), and only many runs bring the floor down to 1.96 × √2."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field

import pandas as pd

from . import kinds
from .errors import DevicelabError
from .schema import BETTER, HIGHER, LOWER

# a side's keys: what a user types -> the row column, and whether a prefix matches (commits, run ids, builds)
ALIASES: dict[str, tuple[str, bool]] = {
    "commit": ("build_commit", True),
    "run": ("run_id", True),
    "build": ("build_key", True),
    "cell": ("cell_id", True),
}
SOURCE_KEYS = ("lab", "from")
SAME, GAIN, REGRESSION, CHANGED, UNTESTED = "same", "gain", "regression", "changed", "n/a"
HOST_BUSY = "host busy"
DEFAULT_ALPHA, DEFAULT_MIN_EFFECT = 0.05, 0.03
BUSY_CPUS = 0.2  # other processes' load on the host (CPUs) from which a side's figures are not judged


def noise_z(df: int) -> float:
    """Two single runs of one build differ by less than this × the between-run sd 95 % of the time, where that sd
    was estimated with `df` degrees of freedom (1.96 × √2 with many)."""
    from scipy import stats

    return float(stats.t.ppf(0.975, max(1, df))) * math.sqrt(2)


@dataclass
class Side:
    label: str
    filters: dict[str, str]
    source: tuple[str, str] | None = None  # ("lab", DIR) or ("from", FILE): rows from elsewhere

    @classmethod
    def parse(cls, text: str) -> Side:
        filters: dict[str, str] = {}
        source = None
        for part in (p.strip() for p in text.split(",") if p.strip()):
            k, eq, v = part.partition("=")
            if not eq or not k.strip() or not v.strip():
                raise DevicelabError(
                    f"compare side {text!r}: {part!r} is not KEY=VALUE (e.g. commit=0c1e570, "
                    "backend=vulkan, device=pixel-8, run=RUN_ID, lab=DIR)"
                )
            k, v = k.strip(), v.strip()
            if k in SOURCE_KEYS:
                source = (k, v)
            else:
                filters[k] = v
        if not filters and source is None:
            raise DevicelabError(f"compare side {text!r} selects nothing; give KEY=VALUE filters")
        return cls(text, filters, source)

    def select(self, df: pd.DataFrame) -> pd.DataFrame:
        mask = pd.Series(True, index=df.index)
        for k, v in self.filters.items():
            col, prefix = ALIASES.get(k, (k, False))
            if col not in df.columns:
                raise DevicelabError(
                    f"compare: rows have no {k!r}; filter on one of: commit, run, build, "
                    + ", ".join(
                        c
                        for c in ("device", "backend", "model", "quant", "recipe", "target", "payload", "lab_host")
                        if c in df.columns
                    )
                )
            vals = df[col].astype("string")
            mask &= vals.str.startswith(v, na=False) if prefix else (vals == v).fillna(False)
        return df[mask]

    def columns(self) -> set[str]:
        return {ALIASES.get(k, (k, False))[0] for k in self.filters}


@dataclass
class Stat:
    mean: float
    sd: float | None
    n: int
    samples: list[float] = field(default_factory=list)
    runs: int = 1  # how many runs its rows came from


@dataclass
class Pair:
    key: dict
    metric: str
    unit: str
    a: Stat
    b: Stat
    ratio: float | None
    p: float | None = None  # Welch's t, before adjustment
    p_adj: float | None = None  # Holm-adjusted over every tested pair
    verdict: str = UNTESTED
    host_busy: tuple[float | None, float | None] = (None, None)  # CPUs other processes used, A and B (max)
    noise_floor: float | None = None  # one run a side: |B/A − 1| below this is within the ledger's run-to-run noise
    noise_runs: int | None = None  # the runs that floor was learnt from
    one_run: bool = False  # both sides from the same one run: what moves between runs moves both
    test: str = ""  # which test judged it (TESTS)
    ci: tuple[float, float] | None = None  # B/A's 95 % interval
    rounds: int | None = None  # the rounds a paired test rested on


@dataclass
class RunNoise:
    """How much one figure moves between runs of one build on one device (relative sd of the runs' means), pooled
    over every key the ledger measured in two runs or more."""

    rel_sd: float
    runs: int  # the runs it rests on
    keys: int  # the keys (build and cell properties) measured twice or more
    df: int = 0  # its degrees of freedom, in runs: each build's runs less one, summed (0: as many as runs less one)

    @property
    def floor(self) -> float:
        """|B/A − 1| that two single runs of one build stay within 95 % of the time."""
        return noise_z(self.df or self.runs - 1) * self.rel_sd


@dataclass
class Comparison:
    a: str
    b: str
    key_columns: list[str]
    pairs: list[Pair]
    only_a: list[dict]
    only_b: list[dict]
    alpha: float
    min_effect: float

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.pairs:
            out[p.verdict] = out.get(p.verdict, 0) + 1
        return out

    def significant(self) -> list[Pair]:
        return [p for p in self.pairs if p.verdict in (GAIN, REGRESSION, CHANGED)]

    def to_json(self) -> dict:
        return {
            "a": self.a,
            "b": self.b,
            "key_columns": self.key_columns,
            "alpha": self.alpha,
            "min_effect": self.min_effect,
            "pairs": [asdict(p) for p in self.pairs],
            "only_a": self.only_a,
            "only_b": self.only_b,
        }


def _samples(row) -> list[float]:
    s = row.get("samples")
    if isinstance(s, str) and s.startswith("["):
        try:
            return [float(x) for x in json.loads(s)]
        except (ValueError, TypeError):
            return []
    return list(s) if isinstance(s, list) else []


def _stat(rows: pd.DataFrame) -> Stat:
    """One side's figure for a key: the repetitions of every row of it pooled, else its means."""
    samples: list[float] = []
    for s in rows["samples"] if "samples" in rows.columns else ():  # one column, not a Series per row
        samples += _samples({"samples": s})
    vals = pd.to_numeric(rows["value"], errors="coerce").dropna()
    if len(samples) >= 2:
        s = pd.Series(samples)
        return Stat(float(s.mean()), float(s.std(ddof=1)), len(samples), samples)
    if len(vals) == 1:
        r = rows.iloc[0]
        sd = pd.to_numeric(pd.Series([r.get("stddev")]), errors="coerce").iloc[0]
        n = pd.to_numeric(pd.Series([r.get("n")]), errors="coerce").iloc[0]
        return Stat(float(vals.iloc[0]), None if pd.isna(sd) else float(sd), 1 if pd.isna(n) else int(n))
    return Stat(float(vals.mean()), float(vals.std(ddof=1)) if len(vals) > 1 else None, len(vals), list(vals))


def _run_means(rows: pd.DataFrame) -> Stat:
    """One side's figure over its runs: each run's mean is one sample, so the test knows the noise between runs."""
    means = [_stat(g).mean for _, g in rows.groupby("run_id", sort=True)]
    s = pd.Series(means)
    return Stat(float(s.mean()), float(s.std(ddof=1)), len(means), means, runs=len(means))


PAIRED, WELCH_REPS, WELCH_RUNS = "paired", "welch-repetitions", "welch-runs"
TESTS = {
    PAIRED: "paired t over the rounds both sides share (log B/A per round)",
    WELCH_REPS: "Welch's t over the repetitions",
    WELCH_RUNS: "Welch's t over the runs' means",
}


def _by_round(rows: pd.DataFrame) -> pd.Series:
    """One side's figure per round (the mean of its rows measured in that round); empty without rounds."""
    if "round" not in rows.columns:
        return pd.Series(dtype=float)
    r = pd.to_numeric(rows["round"], errors="coerce")
    v = pd.to_numeric(rows["value"], errors="coerce")
    ok = r.notna() & v.notna()
    return v[ok].groupby(r[ok].astype(int)).mean()


def over_rounds(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows measured in rounds pooled: each figure (equal on its kind's key properties, commit and recipe) becomes
    one row holding the mean over its rounds (its other columns from its first round), so a best-of over rows (the
    results table, a recommendation) never picks a lucky round. Rows without a round are left as they are."""
    if "round" not in rows.columns or rows.empty or rows["round"].isna().all():
        return rows
    inr, rest = rows[rows["round"].notna()], rows[rows["round"].isna()]
    keys = [c for c in (*key_columns(inr, set()), "build_commit", "recipe") if c in inr.columns]
    ident = inr[keys].astype("string").fillna("").agg("\x1f".join, axis=1)
    value = pd.to_numeric(inr["value"], errors="coerce").groupby(ident, sort=False).transform("mean")
    pooled = inr.assign(value=value)[~ident.duplicated()]
    return pd.concat([rest, pooled]).sort_index() if not rest.empty else pooled


def paired_rounds(ra: pd.DataFrame, rb: pd.DataFrame) -> tuple[pd.Series, pd.Series] | None:
    """Both sides' figures in the rounds they share (two or more, every figure positive), else None: sides measured
    in the same rounds sat side by side, so what moved the machine between rounds moved both."""
    a, b = _by_round(ra), _by_round(rb)
    shared = a.index.intersection(b.index)
    if len(shared) < 2:
        return None
    a, b = a.loc[shared], b.loc[shared]
    return (a, b) if (a > 0).all() and (b > 0).all() else None


def paired_t(a: list[float], b: list[float]) -> tuple[float, float, tuple[float, float]]:
    """(B/A, two-sided p, B/A's 95 % interval) from the per-round log ratios ln(b/a): Student's t over them, so
    B/A is their geometric mean and the interval exp(mean ± t·sd/√n)."""
    from scipy.special import stdtr, stdtrit

    d = [math.log(y / x) for x, y in zip(a, b, strict=True)]
    n, m = len(d), statistics.fmean(d)
    sd = statistics.stdev(d)
    if sd == 0:
        return math.exp(m), (1.0 if m == 0 else 0.0), (math.exp(m), math.exp(m))
    se = sd / math.sqrt(n)
    half = float(stdtrit(n - 1, 0.975)) * se
    return math.exp(m), float(2 * stdtr(n - 1, -abs(m / se))), (math.exp(m - half), math.exp(m + half))


def ratio_interval(a: Stat, b: Stat) -> tuple[float, float] | None:
    """B/A's 95 % interval for two independent sides (the delta method on log B/A, Welch–Satterthwaite degrees of
    freedom); None where a side has no spread or no positive mean."""
    from scipy.special import stdtrit

    if a.sd is None or b.sd is None or a.n < 2 or b.n < 2 or a.mean <= 0 or b.mean <= 0:
        return None
    va, vb = (a.sd / a.mean) ** 2 / a.n, (b.sd / b.mean) ** 2 / b.n
    if va + vb == 0:
        return None
    df = (va + vb) ** 2 / (va * va / (a.n - 1) + vb * vb / (b.n - 1))
    half = float(stdtrit(df, 0.975)) * math.sqrt(va + vb)
    r = math.log(b.mean / a.mean)
    return math.exp(r - half), math.exp(r + half)


def _welch(a: Stat, b: Stat) -> float | None:
    """Welch's t-test p-value over the repetitions; None where a side has no spread to test against."""
    if len(a.samples) >= 2 and len(b.samples) >= 2:
        if a.sd == 0 and b.sd == 0:
            return 1.0 if a.mean == b.mean else 0.0
        xa, xb = a.samples, b.samples
        return welch_p(
            statistics.fmean(xa),
            statistics.variance(xa),
            len(xa),
            statistics.fmean(xb),
            statistics.variance(xb),
            len(xb),
        )
    if a.n >= 2 and b.n >= 2 and a.sd is not None and b.sd is not None and (a.sd > 0 or b.sd > 0):
        return welch_p(a.mean, a.sd**2, a.n, b.mean, b.sd**2, b.n)
    return None


def welch_p(ma: float, va: float, na: int, mb: float, vb: float, nb: int) -> float:
    """Two-sided p of Welch's t from each side's mean, variance and count (Welch–Satterthwaite degrees of freedom),
    as scipy.stats.ttest_ind(equal_var=False) gives it; Student's t distribution from scipy.special (importing
    scipy.stats costs a command 0.8 s, scipy.special 0.2 s)."""
    from scipy.special import stdtr

    sa, sb = va / na, vb / nb
    df = (sa + sb) ** 2 / (sa * sa / (na - 1) + sb * sb / (nb - 1))
    t = (ma - mb) / math.sqrt(sa + sb)
    return float(2 * stdtr(df, -abs(t)))


def holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjustment: the family-wise error stays at alpha however many pairs are tested."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out = [1.0] * len(ps)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        out[i] = running
    return out


def key_properties(payload: str) -> tuple[str, ...]:
    return kinds.get(payload).key_properties if payload in kinds.REGISTRY else kinds.base.Kind.key_properties


def key_columns(df: pd.DataFrame, compared: set[str]) -> list[str]:
    """Every key property of the rows' kinds present in the rows, less what the sides differ in (for display:
    each payload's rows pair on their own kind's properties)."""
    cols: list[str] = ["payload"]
    for payload in sorted(df["payload"].dropna().unique()):
        cols += [c for c in key_properties(payload) if c not in cols]
    return [c for c in cols if c in df.columns and c not in compared]


def _groups(df: pd.DataFrame, compared: set[str]) -> dict[tuple, tuple[dict, pd.DataFrame]]:
    """Rows grouped by their kind's key properties: {(payload, values…): (key dict, rows)}."""
    df = df[pd.to_numeric(df["value"], errors="coerce").notna()]
    out: dict[tuple, tuple[dict, pd.DataFrame]] = {}
    for payload, rows in df.groupby("payload", sort=True):
        keys = [c for c in key_properties(str(payload)) if c in rows.columns and c not in compared]
        filled = rows[keys].astype("string").fillna("")
        for k, g in rows.groupby([filled[c] for c in keys], sort=True, dropna=False):
            k = k if isinstance(k, tuple) else (k,)
            out[(str(payload), *k)] = ({"payload": str(payload), **dict(zip(keys, k, strict=True))}, g)
    return out


def _busy(rows: pd.DataFrame) -> float | None:
    """The most CPUs other processes kept busy while any of these rows measured on the host (None: not known)."""
    if "host_busy_cpus" not in rows.columns:
        return None
    v = pd.to_numeric(rows["host_busy_cpus"], errors="coerce").dropna()
    return float(v.max()) if len(v) else None


def busy(pair: Pair, max_busy: float = BUSY_CPUS) -> bool:
    """A side of it was measured while other processes kept `max_busy` of the host's CPUs or more busy."""
    return any(x is not None and x >= max_busy for x in pair.host_busy)


def _verdict(pair: Pair, alpha: float, min_effect: float, max_busy: float | None = BUSY_CPUS) -> str:
    if pair.p_adj is None or pair.ratio is None:
        return UNTESTED
    if max_busy is not None and busy(pair, max_busy):
        return HOST_BUSY
    if pair.p_adj >= alpha or abs(pair.ratio - 1) < max(min_effect, pair.noise_floor or 0.0):
        return SAME
    better = BETTER.get(pair.metric)
    if better is None:
        return CHANGED
    up = pair.ratio > 1
    return GAIN if (up and better == HIGHER) or (not up and better == LOWER) else REGRESSION


def run_noise(history: pd.DataFrame, max_busy: float | None = BUSY_CPUS) -> dict[tuple[str, str], RunNoise]:
    """{(device, metric): RunNoise} from rows measured in two runs or more of one build with the same cell
    properties (rows measured while the host was busy left out: their scatter is the load's)."""
    need = {"run_id", "device", "metric", "value", "payload"}
    if history.empty or not need <= set(history.columns):
        return {}
    h = history[pd.to_numeric(history["value"], errors="coerce").notna()]
    if max_busy is not None and "host_busy_cpus" in h.columns:
        h = h[~(pd.to_numeric(h["host_busy_cpus"], errors="coerce") >= max_busy)]
    build = next((c for c in ("build_key", "build_commit") if c in h.columns), None)
    # (device, metric) -> [Σ (k−1)·rel var, Σ (k−1), keys, {(payload, build): run ids}]
    pooled: dict[tuple[str, str], list] = {}
    for got, rows in h.groupby(["payload", build] if build else ["payload"], sort=False):
        payload = got[0] if isinstance(got, tuple) else got
        keys = [c for c in key_properties(str(payload)) if c in rows.columns]
        filled = rows[keys].astype("string").fillna("")
        for k, g in rows.groupby([filled[c] for c in keys], sort=False, dropna=False):
            if g["run_id"].nunique() < 2:
                continue
            means = pd.to_numeric(g["value"], errors="coerce").groupby(g["run_id"]).mean()
            m = float(means.mean())
            if not m:
                continue
            key = dict(zip(keys, k if isinstance(k, tuple) else (k,), strict=True))
            dm = (str(key.get("device", "")), str(key.get("metric", "")))
            acc = pooled.setdefault(dm, [0.0, 0.0, 0, {}])
            acc[0] += (len(means) - 1) * float(means.var(ddof=1)) / (m * m)
            acc[1] += len(means) - 1
            acc[2] += 1
            acc[3].setdefault(got, set()).update(means.index)
    return {
        k: RunNoise(
            math.sqrt(v[0] / v[1]),
            len(set().union(*v[3].values())),
            int(v[2]),
            sum(len(r) - 1 for r in v[3].values()),
        )
        for k, v in pooled.items()
        if v[1] > 0
    }


def over_runs(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Both sides hold two runs or more: their test is over the runs, and knows the noise between them."""
    return all("run_id" in df.columns and df["run_id"].nunique() >= 2 for df in (a, b))


def noise_beside(history: pd.DataFrame, a: pd.DataFrame, b: pd.DataFrame, max_busy: float | None = BUSY_CPUS):
    """run_noise of the history less the runs of the two sides (a difference is never its own yardstick); None
    where the sides' test is over their runs already."""
    if over_runs(a, b):
        return None
    if history is None or "run_id" not in history.columns:
        return None
    seen = {r for df in (a, b) if "run_id" in df.columns for r in df["run_id"].dropna().unique()}
    return run_noise(history[~history["run_id"].isin(seen)], max_busy)


def _floor(noise: dict, ra: pd.DataFrame, rb: pd.DataFrame, metric: str) -> tuple[float, int] | None:
    """The run-to-run noise floor of a one-run pair, and the runs it rests on: the noisier of its devices' (both
    sides' devices)."""
    devices = {str(d) for r in (ra, rb) if "device" in r.columns for d in r["device"].dropna().unique()}
    known = [noise[(d, metric)] for d in devices if (d, metric) in noise]
    if not known:
        return None
    worst = max(known, key=lambda n: n.floor)
    return worst.floor, worst.runs


def compare(
    a: pd.DataFrame,
    b: pd.DataFrame,
    side_a: Side,
    side_b: Side,
    metrics: list[str] | None = None,
    alpha: float = DEFAULT_ALPHA,
    min_effect: float = DEFAULT_MIN_EFFECT,
    max_busy: float | None = BUSY_CPUS,
    noise: dict[tuple[str, str], RunNoise] | None = None,
) -> Comparison:
    """Pair the two sides' rows and judge each pair. Metrics default to those with a direction in the schema.
    `max_busy`: the other processes' load (CPUs) from which a pair is not judged; None judges every pair (their
    `host_busy` still says what it was). `noise`: run_noise of rows outside the two sides, for pairs with one run
    a side."""
    if metrics:
        a, b = a[a["metric"].isin(metrics)], b[b["metric"].isin(metrics)]
    else:
        a = a[a["metric"].map(lambda m: BETTER.get(m) is not None)]
        b = b[b["metric"].map(lambda m: BETTER.get(m) is not None)]
    compared = side_a.columns() | side_b.columns()
    keys = key_columns(pd.concat([a, b]), compared)
    ga, gb = _groups(a, compared), _groups(b, compared)
    pairs = []
    for k in sorted(set(ga) & set(gb)):
        (key, ra), (_, rb) = ga[k], gb[k]
        runs = [int(r["run_id"].nunique()) if "run_id" in r.columns else 1 for r in (ra, rb)]
        unit = str(ra["unit"].iloc[0]) if "unit" in ra.columns else ""
        rounds = paired_rounds(ra, rb)
        if rounds is not None:  # measured side by side, round by round: the rounds are the samples, paired
            xa, xb = (list(map(float, x)) for x in rounds)
            sa, sb = (Stat(statistics.fmean(x), statistics.stdev(x), len(x), x) for x in (xa, xb))
            sa.runs, sb.runs = runs
            gm, pv, ci = paired_t(xa, xb)
            pair = Pair(key, key["metric"], unit, sa, sb, gm, pv, test=PAIRED, ci=ci, rounds=len(xa))
        else:
            # two runs or more a side: the runs are the samples (between-run noise in the test); else the repetitions
            sa, sb = (_run_means(ra), _run_means(rb)) if min(runs) >= 2 else (_stat(ra), _stat(rb))
            sa.runs, sb.runs = runs
            ratio = sb.mean / sa.mean if sa.mean and not math.isnan(sa.mean) else None
            pair = Pair(key, key["metric"], unit, sa, sb, ratio, _welch(sa, sb))
            pair.test = WELCH_RUNS if min(runs) >= 2 else WELCH_REPS
            pair.ci = ratio_interval(sa, sb) if pair.p is not None else None
        pair.host_busy = (_busy(ra), _busy(rb))
        pair.one_run = runs == [1, 1] and "run_id" in ra.columns and set(ra["run_id"]) == set(rb["run_id"])
        paired = pair.test == PAIRED
        floor = _floor(noise, ra, rb, pair.metric) if min(runs) < 2 and noise and not pair.one_run else None
        if floor and not paired:
            pair.noise_floor, pair.noise_runs = floor
        pairs.append(pair)
    tested = [(p, p.p) for p in pairs if p.p is not None]
    for (p, _), adj in zip(tested, holm([pv for _, pv in tested]), strict=True):
        p.p_adj = adj
    for p in pairs:
        p.verdict = _verdict(p, alpha, min_effect, max_busy)
    only = lambda mine, other: [mine[k][0] for k in sorted(set(mine) - set(other))]
    return Comparison(side_a.label, side_b.label, keys, pairs, only(ga, gb), only(gb, ga), alpha, min_effect)


MARKS = {
    GAIN: "▲ gain",
    REGRESSION: "▼ regression",
    CHANGED: "≠ changed",
    SAME: "~",
    UNTESTED: "n/a",
    HOST_BUSY: "? host busy",
}


def _fmt(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    a = abs(v)
    return f"{v:.4g}" if a < 1e5 else f"{v:.3e}"


def view(cmp: Comparison) -> tuple[list[str], list[list[str]], dict[str, str]]:
    """(headers, rows of cell texts, the key properties every pair shares): what every format renders. Only
    the key columns that differ between pairs get a column."""
    val = lambda p, c: str(p.key.get(c, ""))
    varying = [c for c in cmp.key_columns if c != "metric" and len({val(p, c) for p in cmp.pairs}) > 1]
    common = {
        c: val(cmp.pairs[0], c)
        for c in cmp.key_columns
        if c not in varying and c != "metric" and cmp.pairs and val(cmp.pairs[0], c) not in ("", "<NA>")
    }
    headers = [*varying, "metric", "unit", "A", "B", "B/A", "95 % interval", "p (Holm)", "n A/B", "verdict"]
    rows = []
    for p in cmp.pairs:
        sd = lambda s: f" ± {_fmt(s.sd)}" if s.sd is not None else ""
        rows.append(
            [
                *(val(p, c) for c in varying),
                p.metric,
                p.unit,
                _fmt(p.a.mean) + sd(p.a),
                _fmt(p.b.mean) + sd(p.b),
                f"{p.ratio:.3f}" if p.ratio is not None else "—",
                f"{p.ci[0]:.3f}–{p.ci[1]:.3f}" if p.ci else "—",
                f"{p.p_adj:.3g}" if p.p_adj is not None else "—",
                f"{p.a.n}/{p.b.n}" + (" rounds" if p.test == PAIRED else ""),
                MARKS[p.verdict] + (_busy_note(p) if p.verdict == HOST_BUSY else ""),
            ]
        )
    return headers, rows, common


def _busy_note(p: Pair) -> str:
    a, b = (f"{x:.2f}" if x is not None else "?" for x in p.host_busy)
    return f" (other load A {a}, B {b} CPUs)"


def summary(cmp: Comparison) -> str:
    c = cmp.counts()
    parts = [f"{len(cmp.pairs)} pairs", f"{c.get(REGRESSION, 0)} regressions", f"{c.get(GAIN, 0)} gains"]
    if c.get(CHANGED):
        parts.append(f"{c[CHANGED]} changed")
    parts.append(f"{c.get(SAME, 0)} unchanged")
    if c.get(UNTESTED):
        parts.append(f"{c[UNTESTED]} untested (one sample a side)")
    if c.get(HOST_BUSY):
        parts.append(
            f"{c[HOST_BUSY]} not judged (other processes kept the host busy while they measured: measure again on a "
            "quiet host)"
        )
    if cmp.only_a or cmp.only_b:
        parts.append(f"{len(cmp.only_a)} only in A, {len(cmp.only_b)} only in B")
    tested = [p for p in cmp.pairs if p.p is not None]
    floors = {p.metric: (p.noise_floor, p.noise_runs) for p in tested if p.noise_floor is not None}
    if tested and all(p.test == PAIRED for p in tested):
        n = sorted({p.rounds for p in tested if p.rounds})
        parts.append(
            f"measured side by side in {'–'.join(map(str, [n[0], n[-1]][: 1 if n[0] == n[-1] else 2]))} rounds: "
            "each round's B/A is one sample, so what moved the machine between rounds moved both sides"
        )
    elif floors:
        parts.append(
            "one run a side: a difference within the run-to-run noise the ledger holds for these devices is not "
            "a change ("
            + ", ".join(f"{m} ±{100 * f:.1f} % from {n} runs" for m, (f, n) in sorted(floors.items()))
            + ")"
        )
    elif tested and all(p.one_run for p in tested):
        parts.append("both sides from one run: what moves between runs moves both, and the repetitions are the test")
    elif tested and all(p.a.runs == 1 and p.b.runs == 1 for p in tested):
        parts.append(
            "one run a side: the test knows the noise within a run, not between runs, which on a shared machine can "
            "be larger (measure a build twice and the ledger learns it; or raise --min-effect above it)"
        )
    used = [TESTS[t] for t in TESTS if any(p.test == t for p in tested)] or [TESTS[WELCH_REPS]]
    return (
        f"A = {cmp.a}, B = {cmp.b}: "
        + ", ".join(parts)
        + f" ({'; '.join(used)}; Holm-adjusted p < {cmp.alpha:g} and |B/A − 1| ≥ {cmp.min_effect:g})"
    )


def unpaired_lines(cmp: Comparison) -> list[str]:
    out = []
    for label, keys in (("only in A", cmp.only_a), ("only in B", cmp.only_b)):
        for k in keys:
            out.append(f"{label}: " + ", ".join(f"{c}={v}" for c, v in k.items() if v not in ("", "<NA>")))
    return out


def markdown(cmp: Comparison) -> str:
    """A table to paste into a pull request."""
    headers, rows, common = view(cmp)
    lines = [summary(cmp), ""]
    if common:
        lines += ["Common to every pair: " + ", ".join(f"{k} = {v}" for k, v in common.items()), ""]
    lines.append("| " + " | ".join(headers) + " |")
    lines.append("|" + "|".join(" --- " for _ in headers) + "|")
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    unpaired = unpaired_lines(cmp)
    if unpaired:
        lines += ["", *(f"- {u}" for u in unpaired)]
    return "\n".join(lines) + "\n"


def frame(cmp: Comparison) -> pd.DataFrame:
    """One line per pair (CSV): every key property, both sides' mean, sd and n, the ratio, p and the verdict."""
    recs = [
        {
            **p.key,
            "unit": p.unit,
            "a_mean": p.a.mean,
            "a_sd": p.a.sd,
            "a_n": p.a.n,
            "b_mean": p.b.mean,
            "b_sd": p.b.sd,
            "b_n": p.b.n,
            "ratio": p.ratio,
            "ratio_ci_low": p.ci[0] if p.ci else None,
            "ratio_ci_high": p.ci[1] if p.ci else None,
            "test": p.test,
            "rounds": p.rounds,
            "p": p.p,
            "p_holm": p.p_adj,
            "noise_floor": p.noise_floor,
            "verdict": p.verdict,
        }
        for p in cmp.pairs
    ]
    recs += [{**k, "verdict": "only in A"} for k in cmp.only_a] + [{**k, "verdict": "only in B"} for k in cmp.only_b]
    return pd.DataFrame(recs)
