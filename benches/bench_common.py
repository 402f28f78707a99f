"""Helpers shared by the side-by-side ratio benchmarks (standard library only)."""

import os
import resource
import time


def cpu_seconds():
    """User plus system CPU seconds of this process (all its threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def drop_caches(pause=0.5):
    """Writes dirty pages out, drops the page cache (as root; skipped
    otherwise) and pauses, so that each run starts from the same state."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass
    time.sleep(pause)
