"""Scheduler commands for the ``geoserve`` CLI: ``geoserve osl train|eval``, ``geoserve policies``.

Each parser sets ``func`` (``args -> int`` exit code) with ``set_defaults``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np


def register(subparsers: Any) -> None:
    """Add the ``osl`` and ``policies`` commands."""
    osl = subparsers.add_parser("osl", help="output-length (OSL) predictor")
    osl.set_defaults(func=lambda args: _help(osl))
    sub = osl.add_subparsers(dest="osl_command", metavar="SUBCOMMAND")

    tr = sub.add_parser("train", help="train the OSL MLP on data/request_traces and save it")
    tr.add_argument("--data", type=Path, default=None, help="trace directory")
    tr.add_argument("--out", type=Path, default=None, help="weights file (.npz)")
    tr.add_argument("--epochs", type=int, default=25)
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--synthetic-rows", type=int, default=5000,
                    help="rows per loadgen synthetic dataset (0: traces only)")  # fmt: skip
    tr.set_defaults(func=_train)

    ev = sub.add_parser("eval", help="accuracy of saved weights on the traces")
    ev.add_argument("--data", type=Path, default=None, help="trace directory")
    ev.add_argument("--weights", type=Path, default=None, help="weights file (.npz)")
    ev.add_argument("--seed", type=int, default=1)
    ev.set_defaults(func=_eval)

    pol = subparsers.add_parser("policies", help="list the scheduling policies and settings")
    pol.set_defaults(func=_policies)


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _print_report(rep: Any) -> None:
    print(f"bucket accuracy: exact {rep.bucket_exact:.3f}, exact-or-adjacent "
          f"{rep.bucket_adjacent:.3f} (chance {1 / 6:.3f})")  # fmt: skip
    print(f"median-quantile bucket: exact {rep.median_bucket_exact:.3f}, exact-or-adjacent "
          f"{rep.median_bucket_adjacent:.3f}")  # fmt: skip
    cov = ", ".join(f"{c:.2f}" for c in rep.quantile_coverage)
    print(f"quantile coverage (target 0.10, 0.50, 0.90): {cov}")
    for name, acc in sorted(rep.per_dataset_exact.items()):
        print(f"  {name:22s} exact {acc:.3f}")


def _train(args: argparse.Namespace) -> int:
    from services.scheduler import osl

    rng = np.random.default_rng(args.seed)
    data = osl.load_training_data(
        rng, args.data or osl.DEFAULT_TRACE_DIR, synthetic_rows=args.synthetic_rows
    )
    pred, rep = osl.train(data, rng, osl.TrainConfig(epochs=args.epochs))
    pred.meta["seed"] = args.seed
    out = args.out or osl.DEFAULT_WEIGHTS
    pred.save(out)
    print(f"trained on {rep.rows_train} rows, held out {rep.rows_holdout}; saved {out}")
    _print_report(rep)
    return 0


def _eval(args: argparse.Namespace) -> int:
    from services.scheduler import osl

    pred = osl.OslPredictor.load(args.weights or osl.DEFAULT_WEIGHTS)
    data = osl.load_training_data(
        np.random.default_rng(args.seed), args.data or osl.DEFAULT_TRACE_DIR
    )
    rep = osl.evaluate(pred, data)
    print(f"evaluated on {rep.rows_holdout} rows (training rows included)")
    _print_report(rep)
    return 0


def _policies(args: argparse.Namespace) -> int:
    from services.scheduler.policies import available, policy_spec

    for name in available():
        spec = policy_spec(name)
        kind = "window" if spec.batch else "per-request"
        print(f"{name} ({kind}): {spec.help.strip()}")
        for key, text in spec.config_help().items():
            print(f"    {key}: {text}")
    return 0
