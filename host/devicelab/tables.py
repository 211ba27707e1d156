"""Views over normalized rows: the wide per-(device, model, quant) summary used by the CLI and report."""

from __future__ import annotations

import pandas as pd


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
