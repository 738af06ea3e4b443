"""Swapping a group's compacted output in for its input segments, crash-safe (docs/protocol.md §7 compaction files).

The steps, each one a rename or unlink, with the directory fsynced between the stages:

    1. write      every output as `<base>.ilog.cleaned` + `<base>.index.cleaned`, fsynced (compaction_writer.py)
    2. commit     rename each output's files to `<final name>.swap`; the rename of the last `.cleaned` file
                  is the commit point
    3. drop       unlink each input segment's index, then its `.ilog`
    4. install    rename each output's `.swap` files to their final names, in seq order

What a restart finds and does (`resolve_interrupted_swap`, called first thing by recovery.py):
- any `.cleaned` file: the crash came before the commit. Every input is still in place: the `.cleaned` and
  `.swap` files are deleted (rolled back).
- `.swap` files and no `.cleaned` one: the group committed. Every `.ilog` whose seq range meets the range of the
  `.swap` segments is an input (outputs tile exactly the group's range, and the groups of a partition never
  overlap): it is deleted with its index, then the `.swap` files are renamed into place (rolled forward). Inputs
  are all gone before the first output is installed, so a plain `.ilog` met by a remaining `.swap` range is never
  an output.
- `.old` files are TANK's: its compaction renames inputs to `.old` only after every output is `.swap`, so with no
  `.cleaned` file they are inputs of a committed swap and are deleted. `.old` beside `.cleaned` cannot come from
  either protocol: RecoveryError, nothing touched.
So a kill -9 at any point leaves the old segments or the new ones, never both and never neither.
"""

from __future__ import annotations

import logging
import os
from typing import Callable, Sequence

from tiered.storage.compaction_writer import OutputSegment
from tiered.storage.names import CLEANED, OLD, SWAP, IlogName, IndexName, SwapLeftover, parse_name
from tiered.storage.segment import SealedSegment, fsync_dir

log = logging.getLogger("tiered.storage")

StepHook = Callable[[str], None]  # called with a step's name before it touches the directory (tests crash there)


class SwapError(Exception):
    """The directory holds compaction files that no crash of either protocol leaves: an operator must look."""


class SwapIncomplete(Exception):
    """A group's swap failed after its commit point. The directory is on its way to the output, the log's segment
    list still names the input: reopening the partition finishes the swap (until then no pass runs)."""


def _no_hook(_step: str) -> None:
    pass


def swap_in(
    directory: str,
    inputs: Sequence[SealedSegment],
    outputs: Sequence[OutputSegment],
    on_step: StepHook | None = None,
) -> list[SealedSegment]:
    """Steps 2-4 for one group whose outputs are written; returns the output segments, ready to read.

    An error before the commit point removes the outputs (the inputs stay); an error after it raises SwapIncomplete
    and leaves the directory for recovery to roll forward when the partition reopens.
    """
    step = on_step or _no_hook
    try:
        for output in outputs:
            step(f"commit {output.filename}")
            os.rename(output.cleaned_path, _swap_path(directory, output.filename))
            step(f"commit {output.index_filename}")
            os.rename(output.cleaned_index_path, _swap_path(directory, output.index_filename))
    except Exception:
        for output in outputs:
            for path in (output.cleaned_path, output.cleaned_index_path, _swap_path(directory, output.filename),
                         _swap_path(directory, output.index_filename)):
                _unlink(path)
        raise
    try:
        step("commit fsync")
        fsync_dir(directory)
        for segment in inputs:
            step(f"drop {segment.filename}")
            _unlink(segment.index_path)
            _unlink(segment.path)
            segment.forget()
        step("drop fsync")
        fsync_dir(directory)
        for output in outputs:
            step(f"install {output.filename}")
            _install(directory, output.filename)
            _install(directory, output.index_filename)
        step("install fsync")
        fsync_dir(directory)
    except Exception as exc:
        span = f"{outputs[0].base}-{outputs[-1].last}"
        raise SwapIncomplete(f"{directory}: the swap of {span} committed, then failed: {exc}") from exc
    return [
        SealedSegment(directory, o.base, o.last, o.freeze_ts, o.size, filename=o.filename, index=o.index)
        for o in outputs
    ]


def discard_uncommitted(directory: str) -> list[str]:
    """Deletes `.cleaned` files left by a pass that failed before its commit; returns their names.

    Raises SwapError when a committed swap is unfinished (`.swap` or `.old` files): only a reopen may finish it.
    """
    leftovers = _leftovers(directory)
    if leftovers[SWAP] or leftovers[OLD]:
        raise SwapError(f"{directory}: a committed compaction swap is unfinished; reopen the partition to finish it")
    for leftover in leftovers[CLEANED]:
        _unlink(os.path.join(directory, leftover.name))
    return [leftover.name for leftover in leftovers[CLEANED]]


def resolve_interrupted_swap(directory: str) -> list[tuple[str, str]]:
    """Rolls an interrupted swap back or forward (see the module docstring). Returns (action, filename) pairs."""
    leftovers = _leftovers(directory)
    cleaned, swapped, old = leftovers[CLEANED], leftovers[SWAP], leftovers[OLD]
    if not (cleaned or swapped or old):
        return []
    if cleaned and old:
        raise SwapError(f"{directory}: both .cleaned and .old compaction files; neither set is known to be whole")
    done: list[tuple[str, str]] = []
    if cleaned:
        for leftover in cleaned + swapped:
            _unlink(os.path.join(directory, leftover.name))
            done.append(("deleted (rolled back)", leftover.name))
        fsync_dir(directory)
        return done
    spans = []
    installs: list[tuple[int, bool, str]] = []  # (base, is an index, final name) of each swapped file
    for leftover in swapped:
        target = leftover.target
        if isinstance(target, IlogName):
            spans.append((target.base, target.last))
        elif not isinstance(target, IndexName):
            raise SwapError(f"{directory}: {leftover.name} is not a segment or an index")
        installs.append((target.base, isinstance(target, IndexName), leftover.final_name))
    low = min((b for b, _ in spans), default=None)
    high = max((last for _, last in spans), default=None)
    for name in sorted(os.listdir(directory)):
        kind = parse_name(name)
        if (isinstance(kind, IlogName) and low is not None and high is not None
                and kind.base <= high and kind.last >= low):
            for input_name in (f"{kind.base}.index", name):
                if _unlink(os.path.join(directory, input_name)):
                    done.append(("deleted (input of a committed swap)", input_name))
    old_names = {leftover.name for leftover in old}
    for leftover in old:
        if isinstance(leftover.target, IlogName) and f"{leftover.target.base}.index.{OLD}" not in old_names:
            # TANK renames an input's .ilog, then its index: this index is still the input's.
            if _unlink(os.path.join(directory, f"{leftover.target.base}.index")):
                done.append(("deleted (input of a committed swap)", f"{leftover.target.base}.index"))
        _unlink(os.path.join(directory, leftover.name))
        done.append(("deleted (input of a committed swap)", leftover.name))
    fsync_dir(directory)
    for _, _, final_name in sorted(installs, key=lambda install: install[:2]):  # by base, each segment first
        _install(directory, final_name)
        done.append(("installed (rolled forward)", final_name))
    fsync_dir(directory)
    return done


def _leftovers(directory: str) -> dict[str, list[SwapLeftover]]:
    found: dict[str, list[SwapLeftover]] = {CLEANED: [], SWAP: [], OLD: []}
    for name in sorted(os.listdir(directory)):
        kind = parse_name(name)
        if isinstance(kind, SwapLeftover):
            found[kind.stage].append(kind)
    return found


def _swap_path(directory: str, final_name: str) -> str:
    return os.path.join(directory, f"{final_name}.{SWAP}")


def _install(directory: str, final_name: str) -> None:
    os.rename(_swap_path(directory, final_name), os.path.join(directory, final_name))


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    log.info("compaction removed %s", path)
    return True
