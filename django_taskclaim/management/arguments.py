"""Argument types shared by the management commands: each validates one value or raises
``argparse.ArgumentTypeError`` with a message that names the problem."""

from __future__ import annotations

import argparse
import re
from datetime import datetime, timedelta

from django.utils import timezone
from django.utils.dateparse import parse_datetime

from django_taskclaim.exceptions import InvalidTaskKey
from django_taskclaim.keys import validate_key, validate_tenant
from django_taskclaim.querysets import TERMINAL

UNITS = {"w": "weeks", "d": "days", "h": "hours", "m": "minutes", "s": "seconds"}
_DURATION = re.compile(r"(\d+)([wdhms])")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be 1 or more")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} must be greater than zero")
    return value


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
    for number, unit in parts:
        value += timedelta(**{UNITS[unit]: int(number)})
    if value <= timedelta():
        raise argparse.ArgumentTypeError(f"{text!r} must be longer than zero")
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
    parsed = parse_datetime(text.strip())
    if parsed is None:
        try:
            return duration(text)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is neither a duration (30d, 12h, 15m, 90s) nor an ISO date/time "
                "(2026-01-31T12:00:00+00:00)") from None
    if timezone.is_naive(parsed):
        parsed = timezone.make_aware(parsed)
    return parsed
