"""Retry backoff: exponential, capped, with a little jitter.

Why jitter: after a broker restart every producer and consumer retries at once; identical delays
would keep them in lock-step. Why only downwards (a factor in [1 - jitter, 1]): so `cap` is a hard
bound that a caller (and a test) can rely on.
"""

from __future__ import annotations

import random
from collections.abc import Callable


def backoff_delay(
    attempt: int, base: float, cap: float, *, jitter: float = 0.2, rand: Callable[[], float] = random.random
) -> float:
    """Seconds to wait before retry number `attempt` (0 = the first retry).

    `min(cap, base * 2**attempt)`, scaled by a random factor in `[1 - jitter, 1]`: never more
    than `cap`, never less than `(1 - jitter) * min(cap, base)`.
    """
    if not 0 <= jitter <= 1:
        raise ValueError(f"jitter {jitter} not in [0, 1]")
    attempt = max(0, attempt)
    delay = cap if attempt > 62 else min(cap, base * (1 << attempt))
    return delay * (1 - jitter * rand())
