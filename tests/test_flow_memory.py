"""The flow's process gives back what a step freed (``flows.pipeline.release_free_memory``), so a step's passing peak
does not stay resident under the next step's."""

import threading
from pathlib import Path

from flows.pipeline import release_free_memory


def resident_mb() -> float:
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) / 1024


def test_memory_a_worker_thread_freed_goes_back_to_the_system():
    kept = []

    def work() -> None:  # a thread of its own, as a step's batches are: its own C heap
        blocks = [bytearray(2000) for _ in range(20_000)]  # 40 MB of C heap blocks (over pymalloc's 512 bytes)
        kept.append(blocks[-1])  # the last block holds the heap's top: freeing the others gives nothing back

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    before = resident_mb()
    release_free_memory()
    assert before - resident_mb() > 20
