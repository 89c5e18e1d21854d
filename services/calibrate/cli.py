"""`geoserve calibrate ...`: fit, roofline, derive, validate, replay, energy.

Each subcommand's function takes the parsed args and returns an exit code; domain errors
(`InvalidInput`, `ConfigError`) propagate to `services.cli`, which prints them and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from services.calibrate import derive as derivemod
from services.calibrate import energy as energymod
from services.calibrate import fit as fitmod
from services.calibrate import replay as replaymod
from services.calibrate import roofline as rl
from services.calibrate import validate as valmod
from services.config.calibration import (
    calibration_path,
    list_setups,
    load_calibration,
    load_calibration_file,
    parse_calibration,
)
from services.model.errors import ConfigError


def _load_setup(setup: str) -> Any:
    """A shipped setup name or a path to a calibration file."""
    p = Path(setup)
    if p.suffix in (".yaml", ".yml") or p.is_file():
        return load_calibration_file(p)
    return load_calibration(setup)


def _base_mapping(setup: str) -> tuple[dict[str, Any], str]:
    p = Path(setup)
    if not (p.suffix in (".yaml", ".yml") or p.is_file()):
        p = calibration_path(setup)
    _load_setup(str(p) if p.exists() else setup)  # validates, names the file on error
    data = yaml.safe_load(p.read_text())
    return data, str(p)


def _write_or_print(text: str, out: str | None) -> None:
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)
        print(f"wrote {out}", file=sys.stderr)
    else:
        sys.stdout.write(text)


def cmd_fit(args: argparse.Namespace) -> int:
    base, base_path = _base_mapping(args.setup)
    table = fitmod.read_steps(args.measurements)
    res = fitmod.fit_steps(table)
    print(f"fit of {args.measurements} (base {base_path})")
    rows = [("prefill_time", res.prefill), ("decode_time", res.decode),
            ("prefill_energy", res.prefill_energy), ("decode_energy", res.decode_energy)]
    for name, f in rows:
        if f is None:
            print(f"  {name:15s} not fitted")
        else:
            print(f"  {name:15s} MAPE {f.mape_pct:6.2f} %  ({f.n_rows} steps)")
    if res.prefill:
        p = res.prefill
        print(f"  prefill: knee {p.knee_tokens:g} tokens, slopes {p.tok_slope_s:.4g} / "
              f"{p.tok_slope_above_s:.4g} s/token, b0 {p.b0_s:.4g} s, b1 {p.b1_s:.4g} s, "
              f"b2 {p.b2_s:.4g} s")
    if res.decode:
        print(f"  decode: alpha {list(res.decode.alpha_s)}, beta {list(res.decode.beta_s)} "
              f"({res.decode.method})")
    for n in res.notes:
        print(f"  note: {n}")
    merged = fitmod.merge_fit(base, res, args.measurements)
    merged["derived"] = "fit"
    parse_calibration(merged, args.out or "<fit output>", "")  # must load through the schema
    if args.out:
        _write_or_print(derivemod.dump_calibration(merged, "geoserve calibrate fit"), args.out)
    else:
        print("  (no --out: calibration file not written)")
    return 0


def cmd_roofline(args: argparse.Namespace) -> int:
    gpu = rl.get_gpu(args.gpu)
    arch = rl.get_model(args.model)
    fitted = rl.roofline_calibration(gpu, arch, args.tp, max_num_seqs=args.max_batch,
                                     max_model_len=args.max_model_len)
    parse_calibration(fitted.mapping, args.out or "<roofline output>", "")
    _write_or_print(derivemod.dump_calibration(fitted.mapping, "geoserve calibrate roofline"),
                    args.out)
    return 0


def cmd_derive(args: argparse.Namespace) -> int:
    setups = [args.setup] if args.setup else list(derivemod.PLANS)
    for s in setups:
        rep = derivemod.derive_setup(s, write=not args.dry_run)
        mape = ", ".join(f"{k} {v:.2f} %" for k, v in rep["mape"].items())
        print(f"{s}: {mape}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    cal = _load_setup(args.setup)
    rates = [float(x) for x in args.rates.split(",")] if args.rates else valmod.PAPER_RATES_RPS
    report = valmod.validate(cal, rates=rates, seed=args.seed)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"validation of {cal.setup} (3 engines, RR, Poisson, CNN-DailyMail-like)")
    print(f"{'rate':>6} {'TTFT s':>10} {'TPOT ms':>9} {'paper TTFT':>11} {'paper TPOT':>11}")
    for p in report["points"]:
        pt = "" if p["paper_ttft_s"] is None else f"{p['paper_ttft_s']:g}"
        pp = "" if p["paper_tpot_s"] is None else f"{p['paper_tpot_s'] * 1e3:g}"
        print(f"{p['rate_rps']:6g} {p['ttft_mean_s']:10.4f} {p['tpot_mean_s'] * 1e3:9.2f} "
              f"{pt:>11} {pp:>11}")
    print(f"capacity {report['capacity_rps']:.2f} req/s (paper {report['paper_capacity_rps']})")
    for name, paper, ours, err in valmod.anchor_errors(report):
        print(f"  {name:24s} paper {paper:<8g} ours {ours:<10.4g} {err:+.1f} %")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    cal = _load_setup(args.setup)
    log = replaymod.read_log(args.log)
    out = replaymod.replay_log(cal, log, args.engines)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"replay of {args.log} ({out['requests']} requests, {out['engines']} engines) "
          f"on {cal.setup}")
    for m, v in out["metrics"].items():
        if v["mape_pct"] is None:
            print(f"  {m:9s} sim mean {v['sim_mean']:.6g}  (not in the log)")
        else:
            print(f"  {m:9s} MAPE {v['mape_pct']:7.3f} %  sim mean {v['sim_mean']:.6g}  "
                  f"measured mean {v['measured_mean']:.6g}  ({v['n']} requests)")
    print(f"  GPU energy {out['sim_gpu_energy_j']:.1f} J (active {out['sim_gpu_active_j']:.1f} J)")
    return 0


def cmd_energy(args: argparse.Namespace) -> int:
    cal = _load_setup(args.setup)
    out = {"setup": cal.setup, "power": energymod.power_table(cal),
           "mlenergy": energymod.mlenergy_comparison(cal)}
    print(json.dumps(out, indent=2))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    for s in list_setups():
        print(s)
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("calibrate", help="fit, derive and check calibration files")
    sub = p.add_subparsers(dest="calibrate_command", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])

    f = sub.add_parser("fit", help="fit latency/energy coefficients to step measurements",
                       description="Columns: " + "; ".join(
                           f"{k}: {v}" for k, v in fitmod.STEP_COLUMNS.items()))
    f.add_argument("--measurements", required=True, help="step-level CSV")
    f.add_argument("--setup", required=True,
                   help="base setup name or calibration file (non-fitted keys come from it)")
    f.add_argument("--out", help="write the fitted calibration file here")
    f.set_defaults(func=cmd_fit)

    r = sub.add_parser("roofline", help="first-cut calibration file from datasheet + architecture")
    r.add_argument("--gpu", required=True, help=f"one of {', '.join(sorted(rl.GPUS))}")
    r.add_argument("--model", required=True,
                   help=f"one of {', '.join(sorted(rl.MODELS))} or a Hugging Face config.json")
    r.add_argument("--tp", type=int, default=1)
    r.add_argument("--max-batch", type=int, default=None, help="max_num_seqs (default: memory)")
    r.add_argument("--max-model-len", type=int, default=None)
    r.add_argument("--out", help="write the file here (default: stdout)")
    r.set_defaults(func=cmd_roofline)

    d = sub.add_parser("derive", help="regenerate the shipped A100 files from measurements")
    d.add_argument("--setup", choices=list(derivemod.PLANS))
    d.add_argument("--dry-run", action="store_true", help="print MAPEs, write nothing")
    d.set_defaults(func=cmd_derive)

    v = sub.add_parser("validate", help="emulate the paper's §V-B validation")
    v.add_argument("--setup", required=True)
    v.add_argument("--json", action="store_true")
    v.add_argument("--seed", type=int, default=valmod.DEFAULT_SEED)
    v.add_argument("--rates", help="comma-separated req/s (default: the paper's 19 rates)")
    v.set_defaults(func=cmd_validate)

    rp = sub.add_parser("replay", help="replay a logged run with all decisions fixed",
                        description="Columns: " + "; ".join(
                            f"{k}: {v}" for k, v in replaymod.LOG_COLUMNS.items()))
    rp.add_argument("--setup", required=True)
    rp.add_argument("--log", required=True)
    rp.add_argument("--engines", type=int, default=None)
    rp.add_argument("--json", action="store_true")
    rp.set_defaults(func=cmd_replay)

    e = sub.add_parser("energy", help="power per GPU and J/token beside ML.ENERGY")
    e.add_argument("--setup", required=True)
    e.set_defaults(func=cmd_energy)

    ls = sub.add_parser("list", help="list shipped setups")
    ls.set_defaults(func=cmd_list)


__all__ = ["register", "ConfigError"]
