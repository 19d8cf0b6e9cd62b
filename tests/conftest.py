import os
import re

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# A skipped test is a kernel test when its reason names a kernel or the CPU feature it needs.
KERNEL_SKIP_REASON = re.compile(r"row_gemm|kernel|AVX|oneDNN|packed", re.IGNORECASE)


# Tests whose subject is threaded code keep torch's own thread count: the kernels pass torch.get_num_threads()
# to OpenMP, so one thread there would leave their multi-threaded split untested.
KEEP_THREADS_FOLDERS = {"cpu"}


@pytest.fixture(autouse=True)
def _deterministic_threads(request):
    """Seed 0, and one intra-op thread for the tiny models (they gain nothing from threads and lose a lot on
    2 shared cores); each test starts from the same count whatever an earlier one set (``--threads`` leaks)."""
    torch.manual_seed(0)
    previous = torch.get_num_threads()
    if request.path.parent.name not in KEEP_THREADS_FOLDERS:
        torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def skip_reason(report) -> str:
    """The reason pytest recorded for a skipped test (longrepr is (path, line, 'Skipped: reason'))."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter):
    """Say which kernel tests did not run here and why: a run without the kernel is not full coverage."""
    skipped = [
        report
        for report in terminalreporter.stats.get("skipped", [])
        if KERNEL_SKIP_REASON.search(skip_reason(report))
    ]
    if not skipped:
        return
    terminalreporter.section("kernel tests not run")
    by_reason: dict[str, list[str]] = {}
    for report in skipped:
        by_reason.setdefault(skip_reason(report), []).append(report.nodeid)
    terminalreporter.write_line(f"{len(skipped)} kernel test(s) skipped on this machine:")
    for reason, nodeids in sorted(by_reason.items(), key=lambda item: -len(item[1])):
        files = sorted({nodeid.split("::")[0] for nodeid in nodeids})
        terminalreporter.write_line(f"  {len(nodeids)} x {reason}  ({', '.join(files)})")
    terminalreporter.write_line(
        "Their logic (packed layout, blocking, packed paths) ran on the PyTorch reference: tests/test_kernel_logic.py."
    )
