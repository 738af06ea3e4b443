"""`python -m bench.profiled_serve <tiered serve options>`: `tiered serve` with a CPU profile of a window, for benchmarks.

A debugging aid of the benchmarks, never part of the broker: what an idle broker spends its CPU on
(`python -m bench.bench_scale_idle --profile DIR`). Every thread is profiled by cProfile with `time.thread_time` as its
clock (CPU time, not wall time: a thread blocked in epoll or on a queue costs nothing), the worker threads from their
start, the event loop's thread from the first signal. SIGUSR1 opens the window (a snapshot of every thread's
counters and of /proc/self/task), the next SIGUSR1 closes it and writes into $TIERED_PROFILE_DIR:
- `window.prof`: the difference of the two snapshots as a pstats file (`python -m pstats`), every thread together;
- `window.txt`: the CPU of each thread over the window (user and system, from /proc) and the functions that took
  the most CPU themselves and with what they called.
"""

from __future__ import annotations

import cProfile
import gc
import io
import json
import os
import pstats
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

from bench.harness import CLOCK_TICKS

_profiles: dict[int, tuple[str, cProfile.Profile]] = {}  # native thread id -> (thread name, its profile)
_lock = threading.Lock()
_opened: dict | None = None
_gc = {"collections": [0, 0, 0], "seconds": [0.0, 0.0, 0.0], "started": 0.0}  # the collector's work so far


def _gc_callback(phase: str, info: dict) -> None:
    if phase == "start":
        _gc["started"] = time.thread_time()
    else:
        generation = info["generation"]
        _gc["collections"][generation] += 1
        _gc["seconds"][generation] += time.thread_time() - _gc["started"]


def _start_in_thread(*_args) -> None:
    """threading.setprofile's hook: the first event of a new thread swaps itself for a cProfile of that thread."""
    sys.setprofile(None)
    profile = cProfile.Profile(time.thread_time)
    with _lock:
        _profiles[threading.get_native_id()] = (threading.current_thread().name, profile)
    profile.enable()


def _tasks() -> dict[int, tuple[float, float]]:
    """Each thread's (user, system) CPU seconds so far, by native thread id."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2:].split()
        out[int(tid)] = (int(fields[11]) / CLOCK_TICKS, int(fields[12]) / CLOCK_TICKS)
    return out


def _snapshot() -> dict:
    with _lock:
        profiles = dict(_profiles)
    return {"at": time.monotonic(), "tasks": _tasks(), "gc": ([*_gc["collections"]], [*_gc["seconds"]]),
            "stats": {tid: list(profile.getstats()) for tid, (_, profile) in profiles.items()}}


def _key(code) -> object:
    return code if not isinstance(code, str) else ("~", code)


def _diff(before: dict, after: dict) -> list:
    """The profiler entries of `after` less those of `before`, every thread merged: what the window cost."""
    merged: dict = {}
    for tid, entries in after["stats"].items():
        old = {_key(e.code): e for e in before["stats"].get(tid, [])}
        for e in entries:
            o = old.get(_key(e.code))
            calls = {}
            for s in e.calls or []:
                os_ = next((c for c in (o.calls or []) if _key(c.code) == _key(s.code)), None) if o else None
                calls[_key(s.code)] = SimpleNamespace(
                    code=s.code, callcount=s.callcount - (os_.callcount if os_ else 0),
                    reccallcount=s.reccallcount - (os_.reccallcount if os_ else 0),
                    totaltime=s.totaltime - (os_.totaltime if os_ else 0.0),
                    inlinetime=s.inlinetime - (os_.inlinetime if os_ else 0.0))
            d = SimpleNamespace(code=e.code, callcount=e.callcount - (o.callcount if o else 0),
                                reccallcount=e.reccallcount - (o.reccallcount if o else 0),
                                totaltime=e.totaltime - (o.totaltime if o else 0.0),
                                inlinetime=e.inlinetime - (o.inlinetime if o else 0.0), calls=calls)
            m = merged.get(_key(e.code))
            if m is None:
                merged[_key(e.code)] = d
            else:
                m.callcount += d.callcount
                m.reccallcount += d.reccallcount
                m.totaltime += d.totaltime
                m.inlinetime += d.inlinetime
                for k, s in d.calls.items():
                    if k in m.calls:
                        c = m.calls[k]
                        c.callcount += s.callcount
                        c.reccallcount += s.reccallcount
                        c.totaltime += s.totaltime
                        c.inlinetime += s.inlinetime
                    else:
                        m.calls[k] = s
    out = []
    for d in merged.values():
        d.calls = [s for s in d.calls.values() if s.callcount > 0]
        if d.callcount > 0:
            out.append(d)
    return out


def _write(before: dict, after: dict, directory: Path) -> None:
    entries = _diff(before, after)
    holder = SimpleNamespace(getstats=lambda: entries)
    cProfile.Profile.snapshot_stats(holder)
    holder.create_stats = lambda: None  # what pstats asks of a profile: its table is `stats`
    stats = pstats.Stats(holder)
    stats.dump_stats(directory / "window.prof")
    elapsed = after["at"] - before["at"]
    names = {tid: name for tid, (name, _) in _profiles.items()}
    names[threading.main_thread().native_id] = "main (event loop)"
    text = io.StringIO()
    text.write(f"window {elapsed:.1f} s\n\nthread CPU over the window (cores: user / system):\n")
    total_u = total_s = 0.0
    for tid, (u, s) in sorted(after["tasks"].items()):
        u0, s0 = before["tasks"].get(tid, (0.0, 0.0))
        du, ds = u - u0, s - s0
        total_u, total_s = total_u + du, total_s + ds
        if du or ds:
            text.write(f"  {tid:>8} {names.get(tid, '?'):<28} {du / elapsed:.4f} / {ds / elapsed:.4f}\n")
    text.write(f"  {'all':>8} {'':<28} {total_u / elapsed:.4f} / {total_s / elapsed:.4f}\n\n")
    for generation in range(3):
        n = after["gc"][0][generation] - before["gc"][0][generation]
        spent = after["gc"][1][generation] - before["gc"][1][generation]
        text.write(f"garbage collections of generation {generation}: {n}, {spent:.3f} s of CPU\n")
    text.write("\n")
    for order in ("tottime", "cumulative"):
        stats.stream = text
        stats.sort_stats(order).print_stats(45)
    stats.sort_stats("tottime").print_callers(25)
    (directory / "window.txt").write_text(text.getvalue())
    (directory / "window.json").write_text(json.dumps({"elapsed_s": elapsed, "cpu_user_s": total_u,
                                                       "cpu_sys_s": total_s}))


def _toggle(*_args) -> None:
    global _opened
    main_tid = threading.main_thread().native_id
    if _opened is None:
        with _lock:
            if main_tid not in _profiles:
                _profiles[main_tid] = ("main", cProfile.Profile(time.thread_time))
        _opened = _snapshot()
        _profiles[main_tid][1].enable()
        return
    _profiles[main_tid][1].disable()
    closed = _snapshot()
    opened, _opened = _opened, None
    directory = Path(os.environ["TIERED_PROFILE_DIR"])
    try:
        _write(opened, closed, directory)
    except Exception:  # a debugging aid: its failure is written where its report was awaited
        (directory / "window.txt").write_text(traceback.format_exc())


def main() -> int:
    if "TIERED_PROFILE_DIR" not in os.environ:
        print("bench.profiled_serve: set TIERED_PROFILE_DIR to the directory the profile goes to", file=sys.stderr)
        return 2
    threading.setprofile(_start_in_thread)
    gc.callbacks.append(_gc_callback)
    signal.signal(signal.SIGUSR1, _toggle)
    from tiered.cli.main import main as tiered_main

    return tiered_main(["serve", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
