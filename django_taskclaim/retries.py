"""When a failed queued task may run again: exponential backoff with jitter."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, fields
from typing import Any

from .exceptions import InvalidArgument


@dataclass(frozen=True)
class Backoff:
    """Attempt ``n`` failed: wait ``base * factor ** (n - 1)`` seconds, at most ``cap``, the
    last ``jitter`` fraction of it drawn at random (so that tasks that failed together do not
    all come back together).

    ``Backoff()`` waits about 0.5–1 s, 1–2 s, 2–4 s… up to 150–300 s.
    """

    base: float = 1.0
    factor: float = 2.0
    cap: float = 300.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        for name in ("base", "factor", "cap", "jitter"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise InvalidArgument(f"Backoff {name} must be a finite number, not {value!r}")
        if self.base < 0 or self.cap < 0:
            raise InvalidArgument("Backoff base and cap must not be negative")
        if self.factor < 1:
            raise InvalidArgument(f"Backoff factor must be 1 or more, not {self.factor!r}")
        if not 0 <= self.jitter <= 1:
            raise InvalidArgument(f"Backoff jitter must be between 0 and 1, not {self.jitter!r}")

    def delay(self, attempt: int) -> float:
        """Seconds before a task whose attempt ``attempt`` (1, 2, …) failed may run again."""
        exponent = max(0, attempt - 1)
        # factor ** exponent overflows for large attempts: the cap is reached long before.
        full = self.cap if exponent > 1023 else min(self.cap, self.base * self.factor ** exponent)
        return full * (1 - self.jitter * random.random())  # noqa: S311 - spreading retries, not a secret

    @classmethod
    def of(cls, value: Any, what: str = "backoff") -> Backoff:
        """A ``Backoff`` from itself, or from a dict of its fields (settings, OPTIONS)."""
        if isinstance(value, Backoff):
            return value
        if isinstance(value, dict):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise InvalidArgument(f"{what} has unknown key(s) {unknown}; known: {sorted(known)}")
            return cls(**value)
        raise InvalidArgument(f"{what} must be a Backoff or a dict of its fields, not {type(value).__name__}")
