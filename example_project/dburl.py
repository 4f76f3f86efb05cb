"""Turn ``DATABASE_URL`` into a Django ``DATABASES`` entry (PostgreSQL or SQLite only).

    postgresql://user:password@host:5432/name?sslmode=require   (also postgres://)
    sqlite:///relative/path.sqlite3      sqlite:////absolute/path.sqlite3

An empty URL means the demo's own SQLite file under ``example_project/var/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

SCHEMES = ("postgresql", "postgres", "sqlite")


def parse_database_url(url: str, default_sqlite: Path) -> dict[str, Any]:
    """A ``DATABASES["default"]`` dict for ``url``; ``ImproperlyConfigured`` says what is wrong."""
    if not url:
        return sqlite_database(default_sqlite)
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise ImproperlyConfigured(
            f"DATABASE_URL scheme {parts.scheme!r} is not supported: use one of "
            f"{', '.join(s + '://' for s in SCHEMES)} "
            "(django-taskclaim runs on PostgreSQL and SQLite)"
        )
    if parts.scheme == "sqlite":
        # sqlite:///rel/path -> "rel/path"; sqlite:////abs/path -> "/abs/path"
        path = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
        if not path:
            raise ImproperlyConfigured(
                "DATABASE_URL sqlite:/// needs a file path, e.g. sqlite:///var/demo.sqlite3"
            )
        return sqlite_database(Path(path))
    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise ImproperlyConfigured(
            f"DATABASE_URL {redact(url)} names no database (…/DBNAME at the end)"
        )
    try:
        port = parts.port
    except ValueError as exc:
        raise ImproperlyConfigured(f"DATABASE_URL {redact(url)} has a bad port: {exc}") from exc
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": unquote(parts.hostname or ""),
        "PORT": str(port or ""),
        "OPTIONS": dict(parse_qsl(parts.query)),
    }


def sqlite_database(path: Path) -> dict[str, Any]:
    # Agents are separate processes writing one file: WAL (set on connect, see testgen.apps) and
    # a generous busy timeout, so a writer waits for the lock instead of failing.
    return {"ENGINE": "django.db.backends.sqlite3", "NAME": str(path), "OPTIONS": {"timeout": 30}}


def redact(url: str) -> str:
    """``url`` with its password replaced, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()
