"""Peak memory of a process and its workers, for the array rows of the benchmarks and the demo.

RSS counts a shared page once per process that maps it; PSS splits it among them, so
the PSS sum is what the machine really spent (Linux: psutil reads
/proc/PID/smaps_rollup, about 0.2 ms a process).
"""

from __future__ import annotations

import contextlib
import gc
import threading

import psutil

from fastpool._bench.peers import _is_infra


class MemorySampler:
    """Peak memory of this process plus its workers, sampled in a thread.

    Two sums, both sampled every ``interval_s``:

    * RSS, what ``top`` shows, counts a page once per process that maps it: a
      forked worker's inherited pages and a segment both sides map count twice, so
      forking peers look bigger than they are.
    * PSS splits each shared page among the processes sharing it, so the sum is
      what the machine really spent (Linux; psutil reads /proc/PID/smaps_rollup,
      ~0.2 ms a process). ``delta`` is the PSS peak minus the PSS before the call.
    """

    def __init__(self, interval_s: float = 0.002) -> None:
        self.interval_s = interval_s
        self._me = psutil.Process()
        self._my_cmdline = self._me.cmdline()
        self._infra: dict[int, bool] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)
        self.baseline_pss = 0
        self.peak_rss = 0
        self.peak_pss = 0

    def sample(self) -> tuple[int, int]:
        """(RSS sum, PSS sum) in bytes, over this process and its workers."""
        rss = pss = 0
        for proc in [self._me, *self._me.children(recursive=True)]:
            if proc.pid != self._me.pid:
                infra = self._infra.get(proc.pid)
                if infra is None:
                    infra = self._infra[proc.pid] = _is_infra(proc, self._my_cmdline)
                if infra:
                    continue
            with contextlib.suppress(psutil.Error):
                mem = proc.memory_full_info()
                rss += mem.rss
                pss += getattr(mem, "pss", mem.rss)
        return rss, pss

    def _update(self) -> None:
        rss, pss = self.sample()
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_pss = max(self.peak_pss, pss)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._update()

    def __enter__(self) -> MemorySampler:
        gc.collect()  # garbage from earlier rounds is not this call's memory
        self.peak_rss, self.baseline_pss = self.sample()
        self.peak_pss = self.baseline_pss
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._update()


def peak_memory(call, repeat: int = 1) -> dict[str, int]:
    """Run ``call`` ``repeat`` times under a MemorySampler; peaks in MB, as extra_info.

    A separate run from the timed rounds, so the sampling thread (which takes the
    GIL) never slows the call being timed."""
    with MemorySampler() as sampler:
        for _ in range(repeat):
            call()
    mb = 2**20
    return {
        "peak_mb": round(sampler.peak_rss / mb),
        "pss_mb": round(sampler.peak_pss / mb),
        "delta_mb": round((sampler.peak_pss - sampler.baseline_pss) / mb),
    }
