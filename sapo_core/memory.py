"""Handing freed memory back to the operating system between the phases of a round.

glibc keeps freed blocks for reuse: after a micro-batch's activations are freed, the
process keeps their pages, and blocks of the next phase (other sizes) come from elsewhere,
so the resident set drifts up by about a gigabyte per round on the bundled model.
`malloc_trim` returns free pages. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        return libc.malloc_trim if libc is not None else None
    except (OSError, AttributeError):
        return None


def releases_memory(device_type: str) -> bool:
    """Whether work on ``device_type`` hands freed pages back between phases (the update's
    passes, generation before the update): on a CPU, whose tensors are the process's heap;
    a GPU's memory is torch's caching allocator's, which glibc's trim does not touch. The
    one rule both phases ask (the update through its plan, sapo_core/grpo/plan.py)."""
    return device_type == "cpu"


def release_free_memory() -> None:
    """Return the allocator's free pages to the operating system (glibc only)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
