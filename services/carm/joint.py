"""Joint experiment: geo-scheduling (paper 1) x CA-RM (paper 2) in the virtual runtime.

Rules / theory of operation
---------------------------
* One topology with a ``carm:`` section (default ``topologies/joint.yaml``) runs four ways,
  same seed and load: (d) round-robin without CA-RM control -- the reference; (a) a
  geo-scheduler alone (greedy, alpha = 0.5, by default); (b) CA-RM alone (round-robin + CA-RM);
  (c) both. "Without CA-RM" is ``carm.control: none``: the renewable supply and the training
  jobs are the same, but engines stay at the top clock and training runs as soon as it can
  (earliest deadline first, every node) -- so every run does the same work.
* Each run is a `SimRun` (``services/sim/runtime.py``); the figures come from its summary:
  carbon, SLO violation ratio, TTFT p90, training deadlines met, renewable share, energy.
* ``write_joint`` writes the markdown table and one PNG (matplotlib, Agg). No clocks here; the
  runtime measures its own wall time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from services.config.topology import Topology, load_topology

J_PER_KWH = 3.6e6

CONFIGS = (
    ("neither", "round-robin", "none"),
    ("geo alone", "GEO", "none"),
    ("CA-RM alone", "round-robin", "carm"),
    ("both", "GEO", "carm"),
)


def variant(topo: Topology, policy: str, policy_config: dict[str, Any], control: str
            ) -> Topology:
    assert topo.carm is not None
    t = topo.with_overrides(policy=policy, policy_config=policy_config)
    return dataclasses.replace(t, carm=dataclasses.replace(topo.carm, control=control))


def run_joint(topology: str = "joint", geo_policy: str = "greedy",
              geo_config: dict[str, Any] | None = None, duration_s: float | None = None,
              progress: Callable[[str], None] | None = None,
              seeds: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """The four runs for each load seed (default: the topology's), one row per run."""
    rows: list[dict[str, Any]] = []
    todo: list[int | None] = list(seeds) if seeds else [None]
    for seed in todo:
        rows += _run_joint_seed(topology, geo_policy, geo_config, duration_s, progress, seed)
    return rows


def _run_joint_seed(topology: str, geo_policy: str, geo_config: dict[str, Any] | None,
                    duration_s: float | None, progress: Callable[[str], None] | None,
                    seed: int | None) -> list[dict[str, Any]]:
    from services.sim.runtime import SimRun

    base = load_topology(topology)
    if seed is not None:
        base = base.with_overrides(seed=seed)
    if base.carm is None:
        from services.model.errors import InvalidInput

        raise InvalidInput("--topology", f"{base.path} has no carm section")
    if duration_s is not None:
        base = base.with_overrides(duration_s=duration_s)
    cfg = {"alpha": 0.5} if geo_config is None and geo_policy == "greedy" else (geo_config or {})
    rows = []
    for label, pol, control in CONFIGS:
        policy = geo_policy if pol == "GEO" else pol
        topo = variant(base, policy, cfg if pol == "GEO" else {}, control)
        s = SimRun(topo).run()
        c = s["carm"]
        jobs = c["training_jobs"]
        row = {
            "seed": base.load.seed,
            "config": label, "policy": policy + (f" (alpha={cfg['alpha']})" if pol == "GEO"
                                                 and "alpha" in cfg else ""),
            "carm": control == "carm",
            "carbon_g": s["carbon_g"]["total"],
            "slo_violation_ratio": s["slo"]["violation_ratio"],
            "ttft_violation_ratio": s["slo"].get("ttft_violation_ratio", float("nan")),
            "tpot_violation_ratio": s["slo"].get("tpot_violation_ratio", float("nan")),
            "ttft_p90_s": s["ttft_s"]["p90"], "tpot_p90_s": s["tpot_s"]["p90"],
            "deadlines_met": c["training_deadlines_met"], "jobs": jobs,
            "deadlines_missed": c["training_deadlines_missed"],
            "renewable_share": c["renewable_share"],
            "facility_kwh": s["energy_j"]["facility"] / J_PER_KWH,
            "training_kwh": c["training_energy_j"] / J_PER_KWH,
            "epochs_done_ratio": c["training_epochs_done"] / c["training_epochs_total"]
            if c["training_epochs_total"] else float("nan"),
            "requests": s["requests"]["completed"],
            "slot_latency_mean_s": c["slot_latency_s"]["mean"],
            "freq_mean_mhz": _mean_freq(c),
            "wall_s": s.get("emulation", {}).get("wall_s", float("nan")),
            "per_region_carbon_g": s["carbon_g"].get("per_region", {}),
        }
        rows.append(row)
        if progress is not None:
            progress(f"seed {base.load.seed}, {label}: carbon {row['carbon_g']:.0f} g, SLO "
                     f"violation {row['slo_violation_ratio']:.4f}, deadlines "
                     f"{row['deadlines_met']}/{jobs}")
    return rows


def mean_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per configuration: the mean over seeds of every number (``n_seeds`` and, as
    ``sd``, the sample standard deviation of each), in the order of `CONFIGS`."""
    out = []
    for label, _, _ in CONFIGS:
        mine = [r for r in rows if r["config"] == label]
        if not mine:
            continue
        m: dict[str, Any] = dict(mine[0])
        m["n_seeds"] = len(mine)
        m["sd"] = {}
        for k, v in mine[0].items():
            if isinstance(v, bool) or not isinstance(v, int | float) or k == "seed":
                continue
            vals = [float(r[k]) for r in mine]
            mean = sum(vals) / len(vals)
            m[k] = mean
            m["sd"][k] = (math.sqrt(sum((x - mean) ** 2 for x in vals) / (len(vals) - 1))
                          if len(vals) > 1 else 0.0)
        out.append(m)
    return out


def _mean_freq(c: dict[str, Any]) -> float:
    vals = [d["gpu_frequency_mhz_mean"] for d in c["dcs"].values()
            if d["gpu_frequency_mhz_mean"] is not None]
    return sum(vals) / len(vals) if vals else float("nan")


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["config"] for r in rows]
    fig, ax = plt.subplots(1, 3, figsize=(12, 3.6))
    colours = ["#888888", "#4477aa", "#228833", "#cc6677"]
    ax[0].bar(labels, [r["carbon_g"] / 1000 for r in rows], color=colours)
    ax[0].set_ylabel("carbon, kgCO2")
    ax[1].bar(labels, [100 * r["slo_violation_ratio"] for r in rows], color=colours)
    ax[1].set_ylabel("SLO violation, %")
    ax[2].bar(labels, [100 * r["renewable_share"] for r in rows], color=colours)
    ax[2].set_ylabel("renewable share of facility energy, %")
    for a in ax:
        a.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _count(v: float) -> str:
    """A count, or a mean count over seeds (one decimal)."""
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.1f}"


def _ratio(v: float | None) -> str:
    return "–" if v is None or v != v else f"{v:.4f}"


def _pct(x: float, ref: float) -> str:
    return f"{100 * (x - ref) / ref:+.1f} %" if ref else "n/a"


def write_joint(rows: list[dict[str, Any]], topo: Topology, out: Path, img: Path,
                verdict: str, per_seed: list[dict[str, Any]] | None = None) -> None:
    """The report: `rows` one per configuration (means over seeds, `mean_rows`), and with
    `per_seed` the runs of every seed."""
    from services.sweep.report import dataset_text

    _plot(rows, img)
    ref = rows[0]
    seeds = sorted({r["seed"] for r in per_seed}) if per_seed else [topo.load.seed]
    assert topo.carm is not None
    lines = [
        "# Joint experiment: geo-scheduling x CA-RM",
        "",
        "Written by `geoserve carm joint` (`services/carm/joint.py`); virtual runtime, "
        f"topology `{Path(topo.path).name}`: {topo.description}; load "
        f"{topo.load.rate_rps:g} req/s (dataset {dataset_text(topo.load.dataset)}, "
        + (f"seeds {', '.join(map(str, seeds))}: means over the seeds, ± their sample "
           "standard deviation" if len(seeds) > 1 else f"seed {seeds[0]}")
        + ") for "
        f"{topo.load.duration_s / 3600:g} h of emulated time from `ci_start_hour` "
        f"{topo.ci_start_hour}; CA-RM slots of {topo.carm.slot_s:g} s, horizon "
        f"{topo.carm.horizon_slots} slots, formulation {topo.carm.formulation}"
        + {"performance": " (Problem 2).", "carbon": " (Problem 1).",
           "ppc": " (Problem 3)."}.get(topo.carm.formulation, "."),
        "",
        "Every run has the same renewable supply and the same training jobs; \"without CA-RM\" "
        "means engines at the top clock and training as soon as it can (earliest deadline "
        "first, all nodes). Carbon is facility carbon of inference and training, grid energy at "
        "each zone's hourly CI and renewable energy at "
        f"{topo.carm.renewable_g_per_kwh:g} gCO2/kWh.",
        "",
        "SLO violation counts requests that miss TTFT or TPOT (or do not complete); the TTFT "
        "and TPOT columns count the requests that miss each budget.",
        "",
        "| config | scheduler | CA-RM | carbon (g) | vs neither | SLO violation "
        "| TTFT viol. | TPOT viol. | TTFT p90 (s) "
        "| TPOT p90 (s) | deadlines met | epochs done | renewable share | facility (kWh) "
        "| training (kWh) | mean clock (MHz) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    def sd(r: dict[str, Any], key: str, fmt: str) -> str:
        v = r.get("sd", {}).get(key)
        return f" ± {v:{fmt}}" if v is not None and r.get("n_seeds", 1) > 1 else ""

    for r in rows:
        lines.append(
            f"| {r['config']} | {r['policy']} | {'yes' if r['carm'] else 'no'} | "
            f"{r['carbon_g']:.0f}{sd(r, 'carbon_g', '.0f')} | "
            f"{_pct(r['carbon_g'], ref['carbon_g'])} | "
            f"{r['slo_violation_ratio']:.4f}{sd(r, 'slo_violation_ratio', '.4f')} | "
            f"{_ratio(r.get('ttft_violation_ratio'))} | "
            f"{_ratio(r.get('tpot_violation_ratio'))} | {r['ttft_p90_s']:.3f} | "
            f"{r['tpot_p90_s']:.4f} | "
            f"{_count(r['deadlines_met'])}/{_count(r['jobs'])} | "
            f"{100 * r['epochs_done_ratio']:.1f} % | "
            f"{100 * r['renewable_share']:.1f} % | "
            f"{r['facility_kwh']:.2f} | {r['training_kwh']:.2f} | {r['freq_mean_mhz']:.0f} |")
    if per_seed and len(seeds) > 1:
        lines += ["", "Per seed (carbon g / SLO violation ratio):", "",
                  "| seed | " + " | ".join(lb for lb, _, _ in CONFIGS) + " |",
                  "|---:|" + "---:|" * len(CONFIGS)]
        for seed in seeds:
            cells = []
            for lb, _, _ in CONFIGS:
                r = next(x for x in per_seed if x["seed"] == seed and x["config"] == lb)
                cells.append(f"{r['carbon_g']:.0f} / {r['slo_violation_ratio']:.4f}")
            lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"![carbon, SLO violation and renewable share per configuration](img/{img.name})",
        "",
        "## Verdict",
        "",
        verdict,
        "",
        "Mean CA-RM planning time per slot (16 DCs, one MILP each): "
        + ", ".join(f"{r['config']} {r['slot_latency_mean_s']:.3f} s" for r in rows if r["carm"])
        + ".",
        "",
        "Reproduce: `geoserve carm joint --out docs/carm-joint.md"
        + (f" --seeds {','.join(map(str, seeds))}" if len(seeds) > 1 else "")
        + f"` ({4 * len(seeds)} virtual runs, about {4 * len(seeds)} minutes on 2 cores).",
        "",
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))


def verdict_text(rows: list[dict[str, Any]]) -> str:
    """Plain statement of whether the combination beats each part alone (carbon, SLO)."""
    by = {r["config"]: r for r in rows}
    both, geo, carm, ref = by["both"], by["geo alone"], by["CA-RM alone"], by["neither"]
    out = []
    for name, other in (("geo-scheduling alone", geo), ("CA-RM alone", carm)):
        dc = 100 * (both["carbon_g"] - other["carbon_g"]) / other["carbon_g"]
        better = "less" if dc < 0 else "more"
        out.append(f"- Both vs {name}: {abs(dc):.1f} % {better} carbon; SLO violation "
                   f"{both['slo_violation_ratio']:.4f} vs {other['slo_violation_ratio']:.4f}; "
                   f"deadlines met {_count(both['deadlines_met'])} vs "
                   f"{_count(other['deadlines_met'])} of {_count(both['jobs'])}.")
    save_geo = ref["carbon_g"] - geo["carbon_g"]
    save_carm = ref["carbon_g"] - carm["carbon_g"]
    save_both = ref["carbon_g"] - both["carbon_g"]
    out.append(f"- Savings vs neither: geo {save_geo:.0f} g, CA-RM {save_carm:.0f} g, both "
               f"{save_both:.0f} g (sum of the parts {save_geo + save_carm:.0f} g): the gains "
               + ("add up." if save_both >= save_geo + save_carm else "overlap (sub-additive)."))
    beats = [n for n, o in (("geo alone", geo), ("CA-RM alone", carm))
             if both["carbon_g"] < o["carbon_g"]]
    slo_worse = both["slo_violation_ratio"] > max(geo["slo_violation_ratio"],
                                                  carm["slo_violation_ratio"])
    out.append("")
    out.append(
        f"**The combination emits less carbon than {' and '.join(beats) or 'neither part'}**"
        + (f", but with a higher SLO violation ratio ({both['slo_violation_ratio']:.4f} vs "
           f"{geo['slo_violation_ratio']:.4f} geo alone, {carm['slo_violation_ratio']:.4f} "
           "CA-RM alone)." if slo_worse else ", without a higher SLO violation ratio."))
    out.append("")
    out.append(where_slo_cost(both, geo, carm))
    out.append("")
    out.append(
        "Why (mechanisms, read from the table): CA-RM saves by clocking the inference engines "
        "down to the lowest level its queueing model says meets the 3 s latency bound (mean "
        f"clock {carm['freq_mean_mhz']:.0f} MHz vs {ref['freq_mean_mhz']:.0f}) and by running "
        "training at an energy-efficient clock (same epochs, "
        f"{carm['training_kwh']:.2f} vs {ref['training_kwh']:.2f} kWh); the geo-scheduler saves "
        "by sending requests to DCs with a low effective CI (grid CI blended with on-site "
        "supply). Inference is the part both act on, so their savings overlap. The cause of "
        "the SLO cost of the combination is not isolated here. A hypothesis: CA-RM sizes each "
        "DC's clock for the load it saw in the previous slot (persistence forecast), while the "
        "geo-scheduler moves load between DCs within a slot, towards the low-CI DCs, whose "
        "clocks may be low; at a low clock the frequency model slows prefill much more than "
        "decode (at 510 MHz, time x2.73 for prefill and x1.18 for decode, from the "
        "calibration's frequency block); a slower prefill lengthens TTFT directly and, as each "
        "prefill step stalls the decode batch, TPOT too. CA-RM's latency model (paper 2 "
        "eq. 1, mean request latency) does not see the TTFT/TPOT SLOs of paper 1.")
    return "\n".join(out)


def seed_consistency(per_seed: list[dict[str, Any]]) -> str:
    """In how many seeds each comparison of the verdict holds ('' for one seed)."""
    seeds = sorted({r["seed"] for r in per_seed})
    if len(seeds) < 2:
        return ""
    by = {(r["seed"], r["config"]): r for r in per_seed}
    n = len(seeds)
    less_geo = sum(by[(s, "both")]["carbon_g"] < by[(s, "geo alone")]["carbon_g"] for s in seeds)
    less_carm = sum(by[(s, "both")]["carbon_g"] < by[(s, "CA-RM alone")]["carbon_g"]
                    for s in seeds)
    slo_worse = sum(by[(s, "both")]["slo_violation_ratio"]
                    > max(by[(s, "geo alone")]["slo_violation_ratio"],
                          by[(s, "CA-RM alone")]["slo_violation_ratio"]) for s in seeds)
    return (f"Per seed: the combination emits less carbon than geo alone in {less_geo} of {n} "
            f"seeds and less than CA-RM alone in {less_carm} of {n}; its SLO violation ratio is "
            f"above both parts' in {slo_worse} of {n}.")


def where_slo_cost(both: dict[str, Any], geo: dict[str, Any], carm: dict[str, Any]) -> str:
    """Which budget the combination misses more often than either part alone (TTFT, TPOT),
    from the per-budget violation ratios, with the p90s beside them."""
    worse = []
    for kind, name in (("ttft", "TTFT"), ("tpot", "TPOT")):
        b, g, c = (r.get(f"{kind}_violation_ratio") for r in (both, geo, carm))
        if b is None or g is None or c is None or b != b or g != g or c != c:
            continue
        if b > max(g, c):
            worse.append(name)
    shows = (f"The SLO cost shows in {' and '.join(worse)}" if worse
             else "Neither the TTFT nor the TPOT violation ratio of the combination is above "
                  "both parts'")
    def cmp(kind: str) -> str:
        return (f"{kind.upper()} violation {_ratio(both.get(kind + '_violation_ratio'))} vs "
                f"{_ratio(geo.get(kind + '_violation_ratio'))} geo alone and "
                f"{_ratio(carm.get(kind + '_violation_ratio'))} CA-RM alone")
    return (f"{shows}: {cmp('ttft')}; {cmp('tpot')}; TTFT p90 {both['ttft_p90_s']:.3f} s vs "
            f"{geo['ttft_p90_s']:.3f} / {carm['ttft_p90_s']:.3f} s; TPOT p90 "
            f"{both['tpot_p90_s'] * 1e3:.1f} ms vs {geo['tpot_p90_s'] * 1e3:.1f} / "
            f"{carm['tpot_p90_s'] * 1e3:.1f} ms.")
