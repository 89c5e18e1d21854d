"""The `geoserve` command line: one entry point, subcommands registered by each package.

Each package that offers commands has a ``cli`` module with
``register(subparsers: argparse._SubParsersAction) -> None``; each registered parser sets
``func`` (``args -> int`` exit code) with ``set_defaults``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from services.model.errors import GeoServeError

# Packages whose `cli` module adds subcommands, in help order.
COMMAND_MODULES = (
    "services.runner.cli",
    "services.calibrate.cli",
    "services.scheduler.cli",
    "services.sweep.cli",
    "services.carm.cli",
    "services.deploy.cli",
    "services.deploy.stack",
    "services.carbonapi.server",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="geoserve",
        description="Emulator of geo-distributed, carbon- and SLO-aware LLM serving.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if name.startswith(str(exc.name)):  # this package offers no commands (yet)
                continue
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except GeoServeError as exc:
        print(f"geoserve: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("geoserve: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
