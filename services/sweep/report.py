"""Build ``docs/results.md`` (tables, plots, paper comparison) from sweep summaries."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REGIMES = (("low", 0.15), ("moderate", 0.40), ("high", math.inf))

# Paper 1 §V-C figures for the dense models (Llama-3.1-8B unless stated), by regime.
PAPER: dict[str, dict[str, str]] = {
    "low": {
        "facility-milp": "highest saving, 53.8–59.6 % (all models); ≤ 1.3 % violation",
        "greedy-a0": "> 1.3 % violation (one of two policies above it)",
        "green-llm": "> 1.3 % violation (one of two policies above it)",
        "*": "carbon-aware policies ≤ 1.3 % violation",
    },
    "moderate": {
        "greedy-a0": "saving ≈ ILP/MILP; violation up to 6.9 %",
        "moer": "= greedy α=0",
        "greedy-a0.9": "saving ≤ 3 %, negligible violation",
        "greedy-a0.5": "up to 54 % saving within 1.9 % violation",
        "ilp": "up to 54 % saving within 1.9 % violation",
        "iterative-ilp": "up to 54 % saving within 1.9 % violation",
        "facility-milp": "up to 54 % saving within 1.9 % violation",
        "green-llm": "comparable saving, violation up to 7.2 %",
    },
    "high": {
        "greedy-a0": "+7.3 pp saving vs α=0.5, +12.1 pp violation; TTFT p50 ≈ 0.5 s",
        "moer": "= greedy α=0",
        "greedy-a0.5": "TTFT p50 ≈ 0.5 s, p99 < 3 s",
        "greedy-a0.9": "emits more than RR",
        "ilp": "≤ 32.8 % saving, ≤ 12.5 % violation; TTFT p50 ≤ 1.2 s, p99 ≤ 3.6 s",
        "iterative-ilp": "TTFT p50 1.8 s, p99 7.5 s; decision p99 6.5 s",
        "facility-milp": "29.2 % saving (base hour); ≤ 12.5 % violation; decision p99 ≤ 0.5 s",
        "green-llm": "≈ +5 pp saving vs ILP/MILP, violation up to 30.7 %",
    },
}


# Saturation throughput per engine measured by `geoserve calibrate validate` (calibration/
# README.md, anchor table: 28.97 req/s for three engines; paper 1 §V-B: 27.58), used only
# for the report's placement estimate.
CAPACITY_RPS_PER_ENGINE: dict[str, float] = {"a100-40gb/llama-3.1-8b-tp1": 28.97 / 3}


def dataset_text(name: str) -> str:
    """The dataset's name and what it is (`services.loadgen.datasets`); a synthetic one
    is said to be synthetic."""
    from services.loadgen.datasets import DATASETS
    from services.model.errors import InvalidInput

    try:
        spec = DATASETS.spec(name)
    except InvalidInput:
        return f"`{name}`"
    if spec.synthetic:
        return (f"`{name}` ({spec.help}; request lengths drawn from that law, not the "
                "dataset's real prompts)")
    return f"`{name}` ({spec.help})"


def regime_of(ratio: float | None) -> str:
    if ratio is None:
        return "?"
    for name, hi in REGIMES:
        if ratio < hi:
            return name
    return "high"


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v * 100:.1f}"


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v * 1e3:.0f}"


def _dec(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v * 1e3:.2f}" if v < 0.01 else f"{v * 1e3:.0f}"


def _mean_tree(trees: Sequence[Any]) -> Any:
    """Element-wise mean of summaries of one shape: numbers are averaged (None where any
    is None), mappings recursed into, anything else taken from the first."""
    first = trees[0]
    if isinstance(first, Mapping):
        return {k: _mean_tree([t[k] for t in trees if isinstance(t, Mapping) and k in t])
                for k in first}
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        if all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in trees):
            return sum(float(t) for t in trees) / len(trees)
        return None
    return first


def seed_of(s: Mapping[str, Any]) -> int:
    return int(s["config"]["load"]["seed"])


def combine(runs: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """One point over several seeds: the mean summary, with the runs by seed kept under
    ``_runs`` (one run is returned as it is)."""
    if len(runs) == 1:
        return runs[0]
    out = dict(_mean_tree(runs))
    out["_runs"] = {seed_of(r): r for r in runs}
    return out


def organise(summaries: Sequence[Mapping[str, Any]]) -> dict[float, dict[str, Mapping[str, Any]]]:
    """Summaries by rate and label, seeds of one point combined (`combine`)."""
    groups: dict[float, dict[str, list[Mapping[str, Any]]]] = {}
    for s in summaries:
        p = s["point"]
        groups.setdefault(float(p["rate_rps"]), {}).setdefault(p["label"], []).append(s)
    return {rate: {lb: combine(runs) for lb, runs in by_label.items()}
            for rate, by_label in groups.items()}


def _paired(s: Mapping[str, Any], rr: Mapping[str, Any]) -> list[float]:
    """Per-seed savings of `s` against round-robin with the same seed."""
    a, b = s.get("_runs"), rr.get("_runs")
    if not a or not b:
        return [1.0 - s["carbon_g"]["total"] / rr["carbon_g"]["total"]]
    return [1.0 - a[k]["carbon_g"]["total"] / b[k]["carbon_g"]["total"]
            for k in sorted(set(a) & set(b))]


def saving(s: Mapping[str, Any], rr: Mapping[str, Any]) -> float:
    """Carbon saving against round-robin (mean of the per-seed savings)."""
    v = _paired(s, rr)
    return sum(v) / len(v)


def _sd(v: Sequence[float]) -> float | None:
    if len(v) < 2:
        return None
    m = sum(v) / len(v)
    return math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))


def saving_sd(s: Mapping[str, Any], rr: Mapping[str, Any]) -> float | None:
    """Sample standard deviation of the per-seed savings (None for one seed)."""
    return _sd(_paired(s, rr))


def violation_sd(s: Mapping[str, Any]) -> float | None:
    runs = s.get("_runs") or {}
    return _sd([r["slo"]["violation_ratio"] for r in runs.values()])


def _pct_sd(v: float | None, sd: float | None) -> str:
    return _pct(v) if sd is None else f"{_pct(v)} ± {sd * 100:.1f}"


def plots(by_rate: Mapping[float, Mapping[str, Mapping[str, Any]]], img: Path,
          prefix: str) -> list[str]:
    """The report's plots, written to `img` as PREFIX_*.png; returns the file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img.mkdir(parents=True, exist_ok=True)
    files = []
    rates = sorted(by_rate)
    fig, axes = plt.subplots(1, len(rates), figsize=(5 * len(rates), 4.2), squeeze=False)
    for ax, rate in zip(axes[0], rates, strict=True):
        runs = by_rate[rate]
        rr = runs.get("round-robin")
        if rr is None:
            continue
        for label, s in sorted(runs.items()):
            x = saving(s, rr) * 100
            y = s["slo"]["violation_ratio"] * 100
            ax.scatter(x, y, s=40)
            ax.annotate(label, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        occ = rr.get("occupancy", {}).get("mean_batch_ratio")
        ax.set_title(f"{rate:g} req/s ({regime_of(occ)}, RR batch {_pct(occ)} %)")
        ax.set_xlabel("carbon saving vs round-robin (%)")
        ax.set_ylabel("SLO violation (%)")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(img / f"{prefix}_saving_vs_violation.png", dpi=110)
    plt.close(fig)
    files.append(f"{prefix}_saving_vs_violation.png")

    high = by_rate[rates[-1]]
    labels = sorted(high)
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.27
    for k, q in enumerate(("p50", "p90", "p99")):
        vals = [(high[lb]["ttft_s"][q] or 0.0) for lb in labels]
        ax.bar([i + (k - 1) * width for i in range(len(labels))], vals, width, label=q)
    ax.axhline(high[labels[0]]["slo"]["ttft_s"], color="red", ls="--", lw=1, label="TTFT SLO")
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("TTFT (s)")
    ax.set_title(f"TTFT at the highest load ({rates[-1]:g} req/s)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(img / f"{prefix}_ttft_high.png", dpi=110)
    plt.close(fig)
    files.append(f"{prefix}_ttft_high.png")

    fig, ax = plt.subplots(figsize=(10, 4))
    for k, q in enumerate(("p50", "p99")):
        vals = [max(high[lb]["scheduler"]["decision_s"][q] or 0.0, 1e-6) * 1e3 for lb in labels]
        ax.bar([i + (k - 0.5) * 0.4 for i in range(len(labels))], vals, 0.4, label=q)
    ax.set_yscale("log")
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("solver time per request (ms; a window's solve for window policies)")
    ax.set_title(f"Scheduler overhead at {rates[-1]:g} req/s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(img / f"{prefix}_overhead.png", dpi=110)
    plt.close(fig)
    files.append(f"{prefix}_overhead.png")
    return files


def falls_strictly(values: Sequence[float]) -> bool:
    """True when every value is strictly below the one before it (no slack: a tie or any
    rise, however small, fails)."""
    return len(values) >= 2 and all(b < a for a, b in zip(values, values[1:], strict=False))


def _trend(values: Sequence[float]) -> str:
    """Percentages joined by arrows, with a second decimal where one decimal would show two
    neighbours as equal."""
    digits = 1
    if any(f"{a * 100:.1f}" == f"{b * 100:.1f}" for a, b in zip(values, values[1:],
                                                                  strict=False)):
        digits = 2
    return " → ".join(f"{v * 100:.{digits}f}" for v in values)


def regime_at(by_rate: Mapping[float, Mapping[str, Mapping[str, Any]]], rate: float) -> str:
    """The load regime of one rate, from round-robin's mean batch ratio there."""
    rr = by_rate[rate].get("round-robin")
    return regime_of(rr.get("occupancy", {}).get("mean_batch_ratio") if rr else None)


def load_label(by_rate: Mapping[float, Mapping[str, Mapping[str, Any]]]) -> str:
    """The rates of a report and their regimes, lowest rate first, e.g.
    ``2400 → 4000 req/s, moderate → high``."""
    rates = sorted(by_rate)
    return (" → ".join(f"{r:g}" for r in rates) + " req/s, "
            + " → ".join(regime_at(by_rate, r) for r in rates))


def expectations(by_rate: Mapping[float, Mapping[str, Mapping[str, Any]]]) -> list[str]:
    """The paper's directional claims checked on the means, strictly: a verdict "holds"
    only if the direction holds with no tolerance."""
    rates = sorted(by_rate)
    lines = []
    if len(rates) >= 2:
        loads = load_label(by_rate)
        for label in sorted(by_rate[rates[0]]):
            if label in ("round-robin", "least-loaded"):
                continue
            sv = []
            for r in rates:
                runs = by_rate[r]
                if label in runs and "round-robin" in runs:
                    sv.append(saving(runs[label], runs["round-robin"]))
            if len(sv) == len(rates):
                ok = falls_strictly(sv)
                lines.append(f"- savings grow as load falls, {label}: {_trend(sv)} % "
                             f"({loads}) — {'holds' if ok else 'does NOT hold'}")
    top = rates[-1]
    high = by_rate[top]
    if all(k in high for k in ("greedy-a0", "ilp", "facility-milp")):
        g = high["greedy-a0"]["slo"]["violation_ratio"]
        i = high["ilp"]["slo"]["violation_ratio"]
        f = high["facility-milp"]["slo"]["violation_ratio"]
        ok = g > i and g > f
        regime = regime_at(by_rate, top)
        where = ("at high load" if regime == "high"
                 else f"at the highest load of this report, which is {regime}, not high")
        lines.append(f"- greedy α=0 violates more than ILP and facility MILP {where} "
                     f"({top:g} req/s): {_pct(g)} % vs {_pct(i)} % / {_pct(f)} % — "
                     f"{'holds' if ok else 'does NOT hold'}")
    return lines


def engines_per_dc(dc: Mapping[str, Any]) -> int:
    """Engines of one DC of a summary's topology: nodes x GPUs per node / TP."""
    m = re.search(r"-tp(\d+)$", str(dc["setup"]))
    tp = int(m.group(1)) if m else 1
    return int(dc["nodes"]) * int(dc["gpus_per_node"]) // tp


def placement_estimate(ci_by_dc: Mapping[str, float], cap_rps_by_dc: Mapping[str, float],
                       rate_rps: float) -> float | None:
    """Carbon saving against an even split (round-robin) of the placement that fills the
    lowest-CI DCs first, each up to its capacity, counting equal energy per request and
    nothing else (no idle or host energy, no batching effect). None if the DCs cannot
    carry the rate."""
    if not ci_by_dc or rate_rps <= 0:
        return None
    left, placed = rate_rps, 0.0
    for dc in sorted(ci_by_dc, key=lambda d: (ci_by_dc[d], d)):
        x = min(cap_rps_by_dc[dc], left)
        placed += x * ci_by_dc[dc]
        left -= x
    if left > 1e-9:
        return None
    even = rate_rps * sum(ci_by_dc.values()) / len(ci_by_dc)
    return 1.0 - placed / even


def estimate_section(by_rate: Mapping[float, Mapping[str, Mapping[str, Any]]],
                     cfg: Mapping[str, Any]) -> list[str]:
    """How much any placement could save at each rate if every DC served at most its
    calibrated saturation throughput (`placement_estimate`), beside the best measured
    saving."""
    dcs = {dc["name"]: dc for reg in cfg["regions"] for dc in reg["dcs"]}
    setups = {dc["setup"] for dc in dcs.values()}
    if len(setups) != 1 or next(iter(setups)) not in CAPACITY_RPS_PER_ENGINE:
        return []
    per_engine = CAPACITY_RPS_PER_ENGINE[next(iter(setups))]
    cap = {name: per_engine * engines_per_dc(dc) for name, dc in dcs.items()}
    rows = []
    for rate in sorted(by_rate):
        runs = by_rate[rate]
        rr = runs.get("round-robin")
        if rr is None:
            continue
        ci = {d["dc"]: float(d["mean_ci_g_per_kwh"]) for d in rr.get("dcs", [])}
        if set(ci) != set(cap):
            continue
        est = placement_estimate(ci, cap, rate)
        others = [(saving(s, rr), lb) for lb, s in runs.items()
                  if lb not in ("round-robin", "least-loaded")]
        best = max(others) if others else None
        rows.append(f"| {rate:g} req/s ({regime_at(by_rate, rate)}) | "
                    f"{sum(cap.values()):.0f} | {_pct(est)} | "
                    + (f"{_pct(best[0])} ({best[1]})" if best else "–") + " |")
    if not rows:
        return []
    return [
        "## What the capacity leaves to save",
        "",
        f"A rough estimate, not a bound the runs must obey: every DC serves at most its "
        f"saturation throughput ({per_engine:.2f} req/s per engine, the calibrated capacity of "
        "`calibration/README.md`; the paper's is 9.19), the lowest-CI DCs are filled first, "
        "every request costs the same energy and idle and host energy are left out; CIs are "
        "those measured in round-robin's run (its first seed's where there are several). "
        "Burst absorption by the "
        "queues and the lower energy per request of fuller batches can take a run above it.",
        "",
        "| load | DC capacity, req/s in all | estimated saving % | best measured saving % |",
        "|---|---:|---:|---:|",
        *rows,
        "",
    ]


def ablation_plot(
    by_rate: Mapping[float, Mapping[str, Mapping[str, Any]]],
    own_only: Mapping[float, Mapping[str, Mapping[str, Any]]],
    img: Path,
    prefix: str,
) -> str:
    """SLO violation and saving of each ablated policy with the peer projection on and
    off, one panel per load; returns the file name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img.mkdir(parents=True, exist_ok=True)
    rates = sorted(own_only)
    fig, axes = plt.subplots(2, len(rates), figsize=(5 * len(rates), 6.4), squeeze=False)
    for j, rate in enumerate(rates):
        runs, rr = by_rate.get(rate, {}), by_rate.get(rate, {}).get("round-robin")
        labels = [lb for lb in sorted(own_only[rate]) if lb in runs]
        if rr is None or not labels:
            continue
        xs = range(len(labels))
        on = [runs[lb] for lb in labels]
        off = [own_only[rate][lb] for lb in labels]
        panels = (
            ("SLO violation (%)", [[s["slo"]["violation_ratio"] * 100 for s in v]
                                   for v in (on, off)]),
            ("carbon saving vs round-robin (%)", [[saving(s, rr) * 100 for s in v]
                                                  for v in (on, off)]),
        )
        for row, (name, (on_vals, off_vals)) in enumerate(panels):
            ax = axes[row][j]
            ax.bar([x - 0.2 for x in xs], on_vals, 0.4, label="project_peers on (default)")
            ax.bar([x + 0.2 for x in xs], off_vals, 0.4, label="own dispatches only")
            ax.set_xticks(list(xs), labels, rotation=20, ha="right", fontsize=8)
            ax.set_ylabel(name)
            ax.grid(alpha=0.3, axis="y")
            if row == 0:
                occ = rr.get("occupancy", {}).get("mean_batch_ratio")
                ax.set_title(f"{rate:g} req/s ({regime_of(occ)})")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    name = f"{prefix}_peer_projection.png"
    fig.savefig(img / name, dpi=110)
    plt.close(fig)
    return name


def ablation_section(
    by_rate: Mapping[float, Mapping[str, Mapping[str, Any]]],
    own_only: Mapping[float, Mapping[str, Mapping[str, Any]]],
    img: Path,
    prefix: str,
) -> list[str]:
    """The peer-projection ablation: each carbon-aware policy with ``project_peers`` on
    (the tables above) against the same point with own dispatches only."""
    if not own_only:
        return []
    lines = [
        "## Peer projection on and off",
        "",
        "Between two polls each scheduler projects its own dispatches onto the snapshot "
        "it decides on; with `project_peers` (the default, the tables above) every own "
        "dispatch counts once per regional scheduler, since the peers decide on the same "
        "snapshot. The same points with own dispatches only (`project_peers: false`):",
        "",
        "| load | policy | saving % on / off | SLO viol. % on / off | "
        "TTFT p50 ms on / off | TTFT p99 ms on / off |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for rate in sorted(own_only):
        runs = by_rate.get(rate, {})
        rr = runs.get("round-robin")
        regime = regime_of(rr.get("occupancy", {}).get("mean_batch_ratio") if rr else None)
        for label, off in sorted(own_only[rate].items()):
            on = runs.get(label)
            if on is None or rr is None:
                continue
            lines.append(
                f"| {rate:g} req/s ({regime}) | {label} | {_pct(saving(on, rr))} / "
                f"{_pct(saving(off, rr))} | {_pct(on['slo']['violation_ratio'])} / "
                f"{_pct(off['slo']['violation_ratio'])} | {_ms(on['ttft_s']['p50'])} / "
                f"{_ms(off['ttft_s']['p50'])} | {_ms(on['ttft_s']['p99'])} / "
                f"{_ms(off['ttft_s']['p99'])} |"
            )
    name = ablation_plot(by_rate, own_only, img, prefix)
    return [*lines, "", f"![{name}](img/{name})", ""]


def render(
    summaries: Sequence[Mapping[str, Any]],
    doc: Path,
    img_dir: Path,
    command: str,
    wall_check: Mapping[str, Mapping[str, Any]] | None = None,
    ablation: Sequence[Mapping[str, Any]] = (),
) -> str:
    by_rate = organise(summaries)
    files = plots(by_rate, img_dir, doc.stem)  # docs/results.md -> img/results_*.png
    rel = Path("img")
    first = summaries[0]
    cfg = first["config"]
    load = cfg["load"]
    seeds = sorted({seed_of(x) for x in summaries})
    seeds_text = (f"seed {seeds[0]}" if len(seeds) == 1
                  else "seeds " + ", ".join(str(k) for k in seeds))
    lines = [
        "# Results: carbon and SLO across policies and loads",
        "",
        f"Generated by `{command}` (virtual runtime; every policy's measured solver time "
        "is charged to emulated time). Do not edit by hand: re-run the command.",
        "",
        f"Topology `{cfg['name']}` ({len(cfg['regions'])} regions × "
        f"{len(cfg['regions'][0]['dcs'])} DCs, {cfg['regions'][0]['dcs'][0]['setup']}), "
        f"dataset {dataset_text(load['dataset'])}, {load['duration_s']:g} s per point of which "
        f"{load['warmup_s']:g} s warm-up, {seeds_text}, SLO TTFT "
        f"{cfg['slo']['ttft_s']} s / TPOT {cfg['slo']['tpot_s'] * 1e3:.0f} ms. "
        "Load regime as in the paper: round-robin's mean per-engine batch over the batch "
        "limit, < 15 % low, 15–40 % moderate, > 40 % high. Savings are relative to "
        "round-robin at the same load; violation counts requests that miss TTFT or TPOT "
        "(rejected or failed count as violations). Decision time is the solver time each "
        "request waited for, percentiles over requests: its own decision for per-request "
        "policies, the solve of its whole window (≤ 300 requests) for window policies; the "
        "wait for the window to close (≤ 100 ms) is not in it."
        + (" Over several seeds every figure is the mean over the seeds, and saving and "
           "violation show ± the sample standard deviation (savings paired with "
           "round-robin's run of the same seed)." if len(seeds) > 1 else ""),
        "",
    ]
    for rate in sorted(by_rate):
        runs = by_rate[rate]
        rr = runs.get("round-robin")
        occ = rr.get("occupancy", {}).get("mean_batch_ratio") if rr else None
        regime = regime_of(occ)
        lines += [
            f"## {rate:g} req/s — {regime} load (RR mean batch {_pct(occ)} % of the limit)",
            "",
            "| policy | carbon g | saving % | SLO viol. % | TTFT p50/p90/p99 ms | "
            "TPOT p50 ms | decision p50/p99 ms | fwd % | paper (dense models) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for label, s in sorted(runs.items(), key=lambda kv: kv[1]["carbon_g"]["total"]):
            sv = saving(s, rr) if rr else None
            t = s["ttft_s"]
            d = s["scheduler"]["decision_s"]
            fwd = s["requests"]["forwarded"] / max(s["requests"]["emitted"], 1)
            paper = PAPER.get(regime, {}).get(label) or PAPER.get(regime, {}).get("*", "")
            sv_sd = saving_sd(s, rr) if rr else None
            lines.append(
                f"| {label} | {s['carbon_g']['total']:.0f} | {_pct_sd(sv, sv_sd)} | "
                f"{_pct_sd(s['slo']['violation_ratio'], violation_sd(s))} | "
                f"{_ms(t['p50'])}/{_ms(t['p90'])}/"
                f"{_ms(t['p99'])} | {_ms(s['tpot_s']['p50'])} | {_dec(d['p50'])}/"
                f"{_dec(d['p99'])} | {_pct(fwd)} | {paper} |"
            )
        lines.append("")
    lines += ["## Expectations (tested, not tuned toward)", "",
              "Each verdict is strict: \"holds\" only if the direction holds on the means "
              "with no tolerance (a tie or any reversal, however small, is \"does NOT "
              "hold\").", "", *expectations(by_rate), ""]
    lines += estimate_section(by_rate, cfg)
    lines += ablation_section(by_rate, organise(ablation), img_dir, doc.stem)
    lines += ["## Plots", ""]
    lines += [f"![{f}]({rel / f})" for f in files]
    lines.append("")
    if wall_check:
        sim, wall = wall_check["sim"], wall_check["wall"]
        lines += [
            "## The wall runtime agrees",
            "",
            f"One point re-run as separate processes over gRPC with real sleeps "
            f"(`geoserve run`), against the virtual runtime with the same seed: topology "
            f"`{wall['config']['name']}`, policy {wall['config']['policy']}, "
            f"{wall['config']['load']['rate_rps']:g} req/s, "
            f"{wall['config']['load']['duration_s']:g} s.",
            "",
            "| | virtual | wall | difference |",
            "|---|---:|---:|---:|",
        ]
        for name, get in (
            ("completed", lambda s: s["requests"]["completed"]),
            ("carbon g", lambda s: s["carbon_g"]["total"]),
            ("TTFT p50 ms", lambda s: s["ttft_s"]["p50"] * 1e3),
            ("TTFT p99 ms", lambda s: s["ttft_s"]["p99"] * 1e3),
            ("TPOT p50 ms", lambda s: s["tpot_s"]["p50"] * 1e3),
            ("SLO violation %", lambda s: s["slo"]["violation_ratio"] * 100),
        ):
            a, b = get(sim), get(wall)
            diff = f"{(b - a) / a * 100:+.1f} %" if a else "–"
            lines.append(f"| {name} | {a:.2f} | {b:.2f} | {diff} |")
        lines += ["", f"Wall run faithful: {wall['emulation']['faithful']} (p99 wake-up "
                      f"lateness {wall['emulation']['lateness_s_p99'] * 1e3:.2f} ms).", ""]
    doc.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines) + "\n"
    doc.write_text(text)
    return text
