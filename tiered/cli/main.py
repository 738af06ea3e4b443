"""`tiered`: the command line. Each command group lives in its own module with a `register(subparsers)`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

GROUPS = ("serve", "topic", "produce", "consume", "status", "verify", "db", "tier", "catalog", "cluster", "cost", "replay",
          "dev")


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
    _remember_parsers(parser)
    return parser


def _remember_parsers(parser: argparse.ArgumentParser) -> None:
    """Each command's parser stores itself in its defaults, so an unknown flag is reported with that command's
    usage instead of the top-level one."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                child.set_defaults(_parser=child)
                _remember_parsers(child)


def _version() -> str:
    from tiered import __version__

    return __version__


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
        args, unknown = parser.parse_known_args(argv)
        if unknown:
            getattr(args, "_parser", parser).error(f"unrecognized arguments: {' '.join(unknown)}")
        return int(args.func(args) or 0)
    except KeyboardInterrupt:  # also while still importing: no traceback, the shell's status for SIGINT
        sys.stderr.write("\n")
        return 130
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly; stdout points at /dev/null so the exit flush cannot fail.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
