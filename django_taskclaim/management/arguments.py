"""Argument types shared by the management commands: each validates one value or raises
``argparse.ArgumentTypeError`` with a message that names the problem."""

from __future__ import annotations

import argparse
import re
from datetime import datetime, timedelta

from django.utils import timezone
from django.utils.dateparse import parse_datetime

from django_taskclaim.exceptions import InvalidArgument, InvalidLease, InvalidTaskKey
from django_taskclaim.identity import validate_key, validate_owner, validate_tenant
from django_taskclaim.status import TERMINAL
from django_taskclaim.values import MAX_INT, lease_seconds, queue_name

UNITS = {"w": "weeks", "d": "days", "h": "hours", "m": "minutes", "s": "seconds"}
_DURATION = re.compile(r"(\d+)([wdhms])")
#: Counts (``--limit``, ``--batch-size``, ``--batch``) fit a 32-bit integer, as SQL ``LIMIT``
#: takes them and as the API's ``positive_int`` allows.
MAX_COUNT = MAX_INT
#: Intervals in seconds (``--every``, ``--requeue-after``): one year at most.
MAX_SECONDS = 365 * 86400.0
#: Durations (``--older-than``, ``--since``): a hundred years at most, so that "now minus
#: the duration" is still a date the databases and Python can hold.
MAX_DURATION = timedelta(days=36500)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be 1 or more")
    if value > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"{text} is too large (at most {MAX_COUNT})")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be greater than zero")
    if not value <= MAX_SECONDS:  # also refuses inf
        raise argparse.ArgumentTypeError(f"{text} seconds is too long (at most {MAX_SECONDS:.0f}, one year)")
    return value


def lease(text: str) -> float:
    """A lease in seconds, within the bounds the claim API enforces: at least the minimum lease,
    at most ``TASKCLAIM_MAX_LEASE`` (read now, as the claim will read it)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    try:
        return lease_seconds(value)
    except InvalidLease as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def owner_name(text: str) -> str:
    """A worker identity the task table can store (as ``claim_next(owner=...)`` checks it)."""
    try:
        return validate_owner(text)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def task_key(text: str) -> str:
    try:
        return validate_key(text)
    except InvalidTaskKey as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def tenant_name(text: str) -> str:
    try:
        return validate_tenant(text)
    except InvalidTaskKey as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``15m``, ``90s``, ``2w``, or a combination such as ``1h30m``."""
    spec = text.strip().lower()
    parts = _DURATION.findall(spec)
    if not spec or "".join(n + u for n, u in parts) != spec:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration: use a number and a unit (s, m, h, d, w), "
            "e.g. 30d, 12h, 1h30m")
    value = timedelta()
    try:
        for number, unit in parts:
            value += timedelta(**{UNITS[unit]: int(number)})
    except OverflowError:
        value = timedelta.max
    if value <= timedelta():
        raise argparse.ArgumentTypeError(f"{text!r} must be longer than zero")
    if value > MAX_DURATION:
        raise argparse.ArgumentTypeError(f"{text!r} is too long (at most {MAX_DURATION.days}d, a hundred years)")
    return value


def terminal_status(text: str) -> str:
    value = text.strip().lower()
    if value not in TERMINAL:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a finished status; choose from {', '.join(TERMINAL)} "
            "(pending and running tasks are never purged)")
    return value


def since_value(text: str) -> timedelta | datetime:
    """A duration before now (``30d``, ``12h``) or an ISO 8601 date/time."""
    try:
        parsed = parse_datetime(text.strip())
    except ValueError as exc:  # well formed, but no such date (2026-02-30)
        raise argparse.ArgumentTypeError(f"{text!r} is not a valid date/time: {exc}") from None
    if parsed is None:
        if _DURATION.search(text.strip().lower()):
            return duration(text)  # its own message: too long, zero...
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a duration (30d, 12h, 15m, 90s) nor an ISO date/time "
            "(2026-01-31T12:00:00+00:00)")
    if timezone.is_naive(parsed):
        parsed = timezone.make_aware(parsed)
    return parsed


def task_database(text: str) -> str:
    """One of the task databases (``TASKCLAIM_DATABASES``, read when the command runs)."""
    from django_taskclaim.conf import settings

    if text not in settings.DATABASES:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a task database; TASKCLAIM_DATABASES lists {', '.join(map(repr, settings.DATABASES))}")
    return text


def queue_arg(text: str) -> str:
    """A queue name: 1–100 printable characters."""
    try:
        return queue_name(text)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
