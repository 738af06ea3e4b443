"""`tiered`: the command line. Each command group lives in its own module with a `register(subparsers)`."""

from __future__ import annotations

import argparse
import importlib
import sys

GROUPS = ("serve", "topic", "produce", "consume", "status", "verify", "db", "tier", "catalog", "replay")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tiered", description="An object-storage tiered broker for TANK clients.")
    parser.add_argument("--version", action="version", version=f"tiered {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in GROUPS:
        try:
            module = importlib.import_module(f"tiered.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"tiered.cli.{name}":
                continue  # a group not present in this build
            raise
        module.register(sub)
    return parser


def _version() -> str:
    from tiered import __version__

    return __version__


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
