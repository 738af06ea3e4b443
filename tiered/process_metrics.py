"""What every Prometheus exporter reports about itself: the build (`tiered_build_info`) and the process
(`process_*`, the names of the Prometheus client libraries' process collector, so existing dashboards work).

Read at scrape time from /proc/self (Linux); where /proc is missing, from getrusage, and the families that need
/proc are left out rather than reported as zero.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import platform
import resource
import time
from pathlib import Path

PROC_SELF = Path("/proc/self")


def build_labels(version: str, native_scan: bool) -> str:
    """The labels of tiered_build_info: the version, the Python, and which native extensions are in use."""
    spark_decode = importlib.util.find_spec("tiered.spark._decode") is not None
    pairs = {"version": version, "python": platform.python_version(),
             "implementation": platform.python_implementation(),
             "native_bundle_scan": "1" if native_scan else "0", "native_spark_decode": "1" if spark_decode else "0"}
    return ",".join(f'{k}="{v}"' for k, v in pairs.items())


def cpu_seconds() -> float:
    """User + system CPU time of this process."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def gc_by_generation(key: str) -> dict[str, float]:
    """One of the cyclic collector's counts (`collections`, `collected`) per generation, labelled as the Prometheus
    client libraries' GC collector does."""
    return {f'generation="{i}"': float(stats[key]) for i, stats in enumerate(gc.get_stats())}


def _stat_fields(proc: Path = PROC_SELF) -> list[str] | None:
    try:
        text = (proc / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after its closing one.
    return text[text.rindex(")") + 2:].split()


def memory_bytes(proc: Path = PROC_SELF) -> tuple[float, float] | None:
    """(resident, virtual) bytes, or None without /proc."""
    fields = _stat_fields(proc)
    if fields is None:
        return None
    # After the name: state is index 0, so vsize (field 23) is index 20 and rss (field 24, in pages) index 21.
    return float(fields[21]) * os.sysconf("SC_PAGE_SIZE"), float(fields[20])


def start_time_s(proc: Path = PROC_SELF, now_s: float | None = None, uptime_text: str | None = None) -> float | None:
    """When the process started, in seconds since the epoch, or None without /proc."""
    fields = _stat_fields(proc)
    if fields is None:
        return None
    try:
        uptime = float((uptime_text or Path("/proc/uptime").read_text()).split()[0])
    except (OSError, ValueError, IndexError):
        return None
    started_after_boot = float(fields[19]) / os.sysconf("SC_CLK_TCK")  # starttime, field 22
    now = time.time() if now_s is None else now_s
    return now - uptime + started_after_boot


def open_fds(proc: Path = PROC_SELF) -> float | None:
    try:
        return float(len(os.listdir(proc / "fd")))
    except OSError:
        return None


def max_fds() -> float:
    return float(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
