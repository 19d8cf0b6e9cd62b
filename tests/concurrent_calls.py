"""Calls made from several threads at once, as requests reach a server together."""

from __future__ import annotations

import threading
from collections.abc import Callable

JOIN_TIMEOUT_S = 30.0


def results_of_concurrent_calls(call: Callable[[], object], threads: int) -> list:
    """``call()``'s result in each of ``threads`` threads started together (a thread that raised gives none)."""
    results: list = []
    started = [threading.Thread(target=lambda: results.append(call())) for _ in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join(timeout=JOIN_TIMEOUT_S)
    return results
