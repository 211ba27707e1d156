"""Views over normalized rows: the wide per-(device, model, quant) summary used by the CLI and report."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .errors import DevicelabError

# what a table of rows must have for results, recommend and report to read it
NEEDED = ("device", "model", "quant", "metric", "value", "phase", "bpw", "model_bytes")
NUMERIC = ("value", "stddev", "bpw", "model_bytes", "n_params", "kv_bytes_per_token", "device_mem_bytes",
           "ram_budget_bytes", "battery_wh", "threads", "n_prompt", "n_gen", "n_depth", "ctx", "n", "n_parallel",
           "contention", "cpu_quota")


def load(path: Path, recipe: str | None = None) -> pd.DataFrame:
    """An exported results table (.parquet or .csv, from `devicelab results --export`), checked: one line
    for a file that is not such a table, lacks its columns or holds non-numbers where numbers go."""
    p = Path(path)
    if not p.exists():
        raise DevicelabError(f"{p} does not exist; export one with `devicelab results --export {p.name}`")
    if p.is_dir():
        raise DevicelabError(f"{p} is a folder; give an exported .parquet or .csv file")
    try:
        if p.suffix == ".parquet":
            df = pd.read_parquet(p)
        elif p.suffix == ".csv":
            df = pd.read_csv(p, encoding="utf-8", low_memory=False)
        else:
            raise DevicelabError(f"{p}: give a .parquet or .csv file exported by `devicelab results --export`")
    except DevicelabError:
        raise
    except UnicodeDecodeError as e:
        raise DevicelabError(f"{p}: not UTF-8 text; give the CSV as `devicelab results --export` wrote it") from e
    except Exception as e:  # noqa: BLE001 - pyarrow/pandas parse errors of every kind: one line
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DevicelabError(f"{p}: not a readable {p.suffix[1:]} table ({msg[:200]})") from e
    missing = [c for c in NEEDED if c not in df.columns]
    if missing:
        raise DevicelabError(f"{p}: not a devicelab results table (no column {', '.join(missing)}); export one with "
                             "`devicelab results --export FILE`")
    for c in NUMERIC:
        if c in df.columns:
            num = pd.to_numeric(df[c], errors="coerce")
            bad = num.isna() & df[c].notna() & (df[c].astype(str).str.strip() != "")
            if bad.any():
                i = int(bad.idxmax())
                raise DevicelabError(f"{p}: column {c} holds {str(df[c].iloc[i])[:40]!r} at row {i + 2}, not a "
                                     "number; fix or re-export the table")
            df[c] = num
    if "throttled" in df.columns:
        df["throttled"] = df["throttled"].map({"1": True, "0": False, 1: True, 0: False, "True": True,
                                               "False": False})
    return df[df["recipe"] == recipe] if recipe and "recipe" in df.columns else df


def wide(rows: pd.DataFrame) -> pd.DataFrame:
    rows = rows[rows["model_bytes"].notna()]
    if rows.empty:
        return pd.DataFrame()
    keys = ["device", "model", "quant"]
    base = rows.groupby(keys, sort=False).agg(bpw=("bpw", "first"), model_bytes=("model_bytes", "first")).reset_index()

    def best(metric, how="max", name=None):
        d = rows[(rows["metric"] == metric) & rows["value"].notna()]
        if d.empty:
            return pd.DataFrame(columns=keys + [name or metric])
        g = d.groupby(keys)["value"]
        return (g.max() if how == "max" else g.min()).rename(name or metric).reset_index()

    out = base
    for metric, how, name in (("prefill_tps", "max", None), ("decode_tps", "max", None), ("kld_mean", "min", None),
                              ("ppl_ratio", "min", None), ("same_top_p", "max", None), ("peak_rss", "max", None),
                              ("temp_max", "max", None)):
        out = out.merge(best(metric, how, name), on=keys, how="left")
    e = rows[(rows["metric"] == "energy_per_token") & (rows["phase"] == "decode") & rows["value"].notna()]
    if not e.empty:
        out = out.merge(e.groupby(keys)["value"].min().rename("decode_j_per_tok").reset_index(), on=keys, how="left")
    else:
        out["decode_j_per_tok"] = float("nan")
    return out.sort_values(["device", "model", "bpw"], ascending=[True, True, False]).reset_index(drop=True)
