"""What the task table may store: leases, counts, text, JSON (payloads, results, their
fingerprints) and the fields of queued work (queue names, priority, "run after").

Everything is checked before the first statement, so a bad value raises a
:class:`~django_taskclaim.exceptions.TaskClaimError` subclass naming the problem and writes nothing.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone
from django.utils.module_loading import import_string

from .conf import settings
from .exceptions import InvalidArgument, InvalidLease, InvalidPayload

#: The shortest lease accepted: anything shorter would expire before the claim's reply arrived
#: (SQLite's clock has millisecond resolution, a round trip takes some).
MIN_LEASE = 0.1
#: The ceiling of ``TASKCLAIM_MAX_LEASE``: an expiry ten years ahead is still a date that
#: Python, the ORM and both databases represent.
LEASE_CEILING = 10 * 365 * 24 * 3600.0
#: Integer columns (``max_attempts``, ``attempts``) are 32-bit on PostgreSQL.
MAX_INT = 2**31 - 1


def max_lease() -> float:
    """The longest lease accepted: ``TASKCLAIM_MAX_LEASE``, never above ten years."""
    return min(settings.MAX_LEASE, LEASE_CEILING)


def lease_seconds(lease: float | int | timedelta | None) -> float:
    """Normalise a lease to seconds between :data:`MIN_LEASE` and ``TASKCLAIM_MAX_LEASE``.

    ``None`` means ``TASKCLAIM_DEFAULT_LEASE``. A lease outside the bounds raises
    :class:`InvalidLease` before anything is written: a huge one would store an expiry the
    ORM cannot load, a tiny one would expire on arrival.
    """
    if lease is None:
        lease = settings.DEFAULT_LEASE
    if isinstance(lease, timedelta):
        seconds = lease.total_seconds()
    elif isinstance(lease, int | float) and not isinstance(lease, bool):
        try:
            seconds = float(lease)
        except OverflowError:  # an integer beyond any float: beyond the maximum too
            raise InvalidLease(f"lease is an integer too large for seconds; TASKCLAIM_MAX_LEASE is "
                               f"{max_lease():g} s") from None
    else:
        raise InvalidLease(f"lease must be seconds or a timedelta, not {type(lease).__name__}")
    if not math.isfinite(seconds) or seconds <= 0:
        raise InvalidLease(f"lease must be a positive, finite duration, not {seconds!r} seconds")
    if seconds < MIN_LEASE:
        raise InvalidLease(f"lease of {seconds!r} seconds is shorter than the minimum of {MIN_LEASE} s: "
                           "it would expire before the claim returned")
    longest = max_lease()
    if seconds > longest:
        raise InvalidLease(f"lease of {seconds:g} seconds is longer than TASKCLAIM_MAX_LEASE ({longest:g} s); "
                           "use a shorter lease and keepalive() heartbeats for long work")
    return seconds


def timeout_seconds(value: Any, name: str) -> float:
    """A timeout as seconds: a positive number (an ``int``, ``float`` or ``timedelta``), else
    :class:`InvalidArgument` naming the option ``name``."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds < float("inf"):
        raise InvalidArgument(f"{name} must be a positive number of seconds, not {value!r}")
    return float(seconds)


def positive_int(value: Any, name: str, maximum: int = MAX_INT) -> int:
    """Return ``value`` if it is an integer from 1 to ``maximum``, else raise :class:`InvalidArgument`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"{name} must be a positive integer, not {value!r}")
    if value > maximum:
        raise InvalidArgument(f"{name} = {value} is too large; the limit is {maximum}")
    return value


def validate_text(value: Any, name: str, max_length: int, error: type[ValueError] = InvalidArgument) -> str:
    """Return ``value`` if the database can store it in a text column of ``max_length``.

    Refused: a non-string, a string over the length, a NUL character (PostgreSQL rejects it in
    text) or a lone surrogate (not encodable as UTF-8).
    """
    if not isinstance(value, str):
        raise error(f"{name} must be a string, not {type(value).__name__}")
    if len(value) > max_length:
        raise error(f"{name} is {len(value)} characters long; the limit is {max_length}")
    if "\x00" in value:
        raise error(f"{name} contains a NUL character at position {value.index(chr(0))}, "
                    "which the database cannot store")
    _check_encodable(value, name, error)
    return value


def _check_encodable(text: str, what: str, error: type[ValueError]) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise error(f"{what} contains a lone surrogate {exc.object[exc.start:exc.end]!r} at position "
                    f"{exc.start}, which UTF-8 (and so the database) cannot store") from None


def clean_text(text: str, max_length: int) -> str:
    """``text`` made storable whatever it holds: NULs dropped, lone surrogates escaped, truncated.

    For error messages, which must be recorded even when they quote the bad input that caused them.
    """
    text = text.replace("\x00", "")
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text[:max_length]


@functools.lru_cache(maxsize=8)
def _load_encoder(path: str) -> type[json.JSONEncoder]:
    try:
        cls = import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(f"TASKCLAIM_JSON_ENCODER = {path!r} cannot be imported: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, json.JSONEncoder)):
        raise ImproperlyConfigured(f"TASKCLAIM_JSON_ENCODER = {path!r} is not a json.JSONEncoder subclass")
    return cls


def json_encoder() -> type[json.JSONEncoder]:
    """The encoder of payloads and results: ``TASKCLAIM_JSON_ENCODER`` (a dotted path or a class)."""
    configured = settings.JSON_ENCODER
    if isinstance(configured, str):
        return _load_encoder(configured)
    if isinstance(configured, type) and issubclass(configured, json.JSONEncoder):
        return configured
    raise ImproperlyConfigured(f"TASKCLAIM_JSON_ENCODER must be a dotted path or a JSONEncoder subclass, "
                               f"not {configured!r}")


# A \u0000 escape in JSON text: a backslash that is not itself escaped, then u0000.
_NUL_ESCAPE = re.compile(r"(?:^|[^\\])(?:\\\\)*\\u0000")


def to_json(
    value: Any, what: str, error: type[ValueError], *, canonical: bool = False, limit: int | None = None,
    limit_setting: str = "", hint: str = "",
) -> str:
    """Serialise ``value`` with the configured encoder into JSON that both databases store.

    Raises ``error`` naming the problem: not serialisable (a set, NaN, an unknown type), a NUL
    character (PostgreSQL's jsonb refuses ``\\u0000``), a lone surrogate, or more than
    ``limit`` bytes. ``canonical`` sorts keys and drops spaces (for fingerprints).
    """
    try:
        text = json.dumps(value, cls=json_encoder(), ensure_ascii=False, allow_nan=False,
                          sort_keys=canonical, separators=(",", ":") if canonical else None)
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise error(f"{what} is not JSON-serialisable: {exc}") from exc
    data = _check_encodable(text, what, error)
    if _NUL_ESCAPE.search(text):
        raise error(f"{what} contains a NUL character (\\u0000), which the database cannot store in JSON")
    if limit is not None and len(data) > limit:
        raise error(f"{what} is {len(data)} bytes of JSON; {limit_setting} allows {limit}{hint}")
    return text


def canonical_json(value: Any, what: str, error: type[ValueError] = InvalidPayload) -> str:
    """Serialise ``value`` to canonical JSON (sorted keys, no NaN), raising ``error`` if impossible.

    Values the JSON encoder converts (``Decimal``, ``datetime``, ``UUID`` with the default
    ``DjangoJSONEncoder``) are stored, and fingerprinted, as the strings it writes.
    """
    return to_json(value, what, error, canonical=True)


def payload_json(payload: Any) -> str | None:
    """The payload as stored (canonical JSON, at most ``TASKCLAIM_MAX_PAYLOAD_BYTES``); ``None`` for none."""
    if payload is None:
        return None
    return to_json(payload, "payload", InvalidPayload, canonical=True, limit=settings.MAX_PAYLOAD_BYTES,
                   limit_setting="TASKCLAIM_MAX_PAYLOAD_BYTES")


def fingerprint(payload: Any) -> str:
    """SHA-256 of the payload's canonical JSON; ``""`` when there is no payload."""
    if payload is None:
        return ""
    return hashlib.sha256(canonical_json(payload, "payload").encode()).hexdigest()


def fingerprint_of(payload_text: str | None) -> str:
    """SHA-256 of already-canonical payload JSON (from :func:`payload_json`); ``""`` for none."""
    return "" if payload_text is None else hashlib.sha256(payload_text.encode()).hexdigest()


# -- queued work ---------------------------------------------------------------------------
#: The queue of queued work when none is named (Django's ``DEFAULT_TASK_QUEUE_NAME``).
DEFAULT_QUEUE = "default"
MAX_QUEUE_LENGTH = 100
MAX_PATH_LENGTH = 255
PRIORITY_RANGE = (-100, 100)  # Django's TASK_MIN_PRIORITY, TASK_MAX_PRIORITY


def queue_name(queue: Any) -> str:
    """A queue name as stored: 1–100 printable characters; ``InvalidArgument`` names the problem."""
    if not isinstance(queue, str) or not queue:
        raise InvalidArgument(f"a queue name must be a non-empty string, not {queue!r}")
    return validate_text(queue, "queue", MAX_QUEUE_LENGTH)


def queue_names(queue: str | Sequence[str]) -> list[str]:
    """One queue name or several, as the sorted list of distinct names a queue claim takes."""
    if not isinstance(queue, str | list | tuple | set | frozenset):
        raise InvalidArgument(f"queue must be a queue name or a sequence of them, not {queue!r}")
    names = [queue] if isinstance(queue, str) else list(queue)
    if not names:
        raise InvalidArgument("name at least one queue")
    return sorted({queue_name(name) for name in names})


def valid_priority(value: Any) -> int:
    """A queued task's priority: a whole number from -100 to 100 (larger runs first)."""
    low, high = PRIORITY_RANGE
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgument(f"priority must be a whole number between {low} and {high}, not {value!r}")
    return value


def valid_run_after(value: Any) -> datetime | None:
    """A "not before" time: an aware datetime, or ``None`` (at once)."""
    if value is None:
        return None
    if not isinstance(value, datetime) or timezone.is_naive(value):
        raise InvalidArgument(f"run_after must be an aware datetime, not {value!r}")
    return value


#: The longest coalescing group: its task's key is ``coalesce:<group>:<32 hex digits>`` (at most 255).
MAX_GROUP_LENGTH = 200


def group_name(value: Any) -> str:
    """A coalescing group as stored: a string of 1 to :data:`MAX_GROUP_LENGTH` printable characters
    (it goes into the task's key); ``InvalidArgument`` saying what is wrong otherwise."""
    if not isinstance(value, str):
        raise InvalidArgument(f"the group must be a string, not {type(value).__name__}")
    if not value:
        raise InvalidArgument("the group is empty: it must name the work that coalesces")
    if len(value) > MAX_GROUP_LENGTH:
        raise InvalidArgument(f"the group is {len(value)} characters long; the limit is {MAX_GROUP_LENGTH}")
    if not value.isprintable():
        bad = next(ch for ch in value if not ch.isprintable())
        raise InvalidArgument(f"the group contains the non-printable character {bad!r} at position {value.index(bad)}")
    _check_encodable(value, "the group", InvalidArgument)
    return value


def coalesce_seconds(value: Any, name: str, maximum: float) -> float:
    """``delay``/``max_delay`` of a coalesced enqueue as seconds from 0 to ``maximum``; else ``InvalidArgument``."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value) if abs(value) < 1e300 else math.inf  # an int beyond any float: too long
    else:
        raise InvalidArgument(f"{name} must be seconds or a timedelta, not {value!r}")
    if not math.isfinite(seconds) or not 0 <= seconds <= maximum:
        raise InvalidArgument(f"{name} must be from 0 to {maximum:g} seconds, not {value!r}")
    return seconds


#: The longest concurrency key (the task table's column).
MAX_CONCURRENCY_KEY_LENGTH = 255


def concurrency_of(key: Any, limit: Any, *, queued: bool = True) -> tuple[str, int] | None:
    """A task's ``(concurrency key, limit)``, or ``None`` for no limit (``""`` and ``None``).

    ``InvalidArgument`` names what is wrong: a key without a limit or a limit without a key, a
    limit that is not a whole number from 1, a key too long or not printable, or a limit on work
    that is not queued (only the queue claim decides limits)."""
    if (key in ("", None)) != (limit is None):
        raise InvalidArgument("concurrency_key and concurrency_limit go together: give both or neither")
    if limit is None:
        return None
    if not queued:
        raise InvalidArgument("concurrency limits are for queued work: give a queue too")
    key = validate_text(key, "concurrency_key", MAX_CONCURRENCY_KEY_LENGTH)
    return key, positive_int(limit, "concurrency_limit")


#: The longest progress note a claim may write (the task table's column).
MAX_PROGRESS_NOTE_LENGTH = 255


def progress_of(fraction: Any, note: Any) -> tuple[float, str]:
    """A claim's progress as stored: ``fraction``, a real number in [0, 1], and ``note``, a string of
    at most :data:`MAX_PROGRESS_NOTE_LENGTH` characters. ``InvalidArgument`` names what is wrong:
    not a number (a bool, a string, NaN), outside [0, 1], or a note the database cannot store."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise InvalidArgument(f"progress must be a number from 0 to 1, not {type(fraction).__name__}")
    value = float(fraction)
    if math.isnan(value):
        raise InvalidArgument("progress is NaN; it must be a number from 0 to 1")
    if not 0.0 <= value <= 1.0:
        raise InvalidArgument(f"progress = {value!r} is outside [0, 1]")
    return value, validate_text(note, "progress note", MAX_PROGRESS_NOTE_LENGTH)
