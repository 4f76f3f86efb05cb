"""Durable steps inside one task: ``claim.step(name, fn, *args, **kwargs)`` runs ``fn`` once across
the task's attempts.

The first time a step returns, its result is stored under the task by a fenced write (one statement
guarded by the claim's token, ``transitions.store_step``); a later attempt (after a crash, a
takeover, a retry) reads it instead of calling ``fn`` again. A claim reads the task's stored steps
once, at its first step, in one statement that also checks the claim still holds the task; a step
already stored costs nothing more. A stale owner's step stores nothing (``StaleClaim``).

Inside a transaction on the claim's database (``fenced()``, the caller's ``atomic()``) the store is
one of the transaction's writes: it commits with it, or, rolled back, is as if the step never ran
(the next call of the step runs ``fn`` again).

A store that fails on a database error (its session dropped inside a transaction) keeps the result:
the same claim's next call of the step stores it without calling ``fn`` again. The window left:
``fn`` returned and the process died (or the store was refused) before the store committed. The
next attempt then calls ``fn`` again; give ``fn``'s external call ``claim.idempotency_key(effect=name)``
so that the downstream sees one call.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from asgiref.sync import sync_to_async
from django.db import Error as DbError
from django.db import connections, transaction

from ..conf import settings
from ..exceptions import InvalidArgument, TaskClaimError, TimedOut
from ..idempotency import MAX_EFFECT_LENGTH
from ..values import to_json, validate_text
from . import transitions

#: The longest step name: an effect's, so that ``claim.idempotency_key(effect=name)`` keys its call.
MAX_STEP_NAME_LENGTH = MAX_EFFECT_LENGTH


class Claim(transitions.Holder, Protocol):
    """What the steps need of the claim that runs them (:class:`~.claim.Claim`): named here, not
    imported, so that the claim, which offers ``claim.step``, is the only arrow."""

    def overran(self) -> bool: ...

    def named(self) -> transitions.Named: ...

    def _refuse(self, action: str) -> None: ...


def step_name(name: Any) -> str:
    """``name`` if it can name a step: a non-empty string of at most 200 characters, no NUL."""
    validate_text(name, "a step's name", MAX_STEP_NAME_LENGTH)
    if not name:
        raise InvalidArgument("a step's name must not be empty")
    return str(name)


def step_timeout(timeout: Any) -> float | None:
    """A step's timeout in seconds (``None``: none), a positive number."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0 or timeout != timeout:
        raise InvalidArgument(f"a step's timeout must be a positive number of seconds, not {timeout!r}")
    return float(timeout)


class Steps:
    """A claim's steps: the task's stored results (JSON text by name), read at the first step."""

    def __init__(self, claim: Claim) -> None:
        self.claim = claim
        self._stored: dict[str, str] | None = None
        # Steps stored inside a transaction still open (or since rolled back): read again if asked for.
        self._uncommitted: set[str] = set()
        # Results whose store failed (a database error): the call happened, so a retry of the step
        # by this claim stores this result rather than calling the function again.
        self._unstored: dict[str, str] = {}
        self._lock = threading.Lock()

    # -- the store: sync, on the claim's connection (the ORM's thread for astep) -----------------
    def stored(self) -> dict[str, str]:
        """The task's stored steps, read once per claim (one statement); ``StaleClaim`` if fenced off."""
        with self._lock:
            if self._stored is None:
                rows = transitions.read_steps(self.claim)
                if rows is None:
                    self.claim._refuse("step")
                self._stored = {name: row.result for name, row in (rows or {}).items()}
            return self._stored

    def stored_result(self, name: str) -> tuple[bool, Any]:
        """``(True, result)`` for a step stored already, else ``(False, None)``."""
        text = self.stored().get(name)
        if text is None and name in self._uncommitted:
            # Stored in a transaction that has not committed: there if it is still open, gone with a
            # rollback (of a savepoint too). The database knows which.
            row = transitions.read_step(self.claim, name)
            if row is None:
                self._uncommitted.discard(name)
            else:
                text = row.result
        return (False, None) if text is None else (True, json.loads(text))

    def store(self, name: str, value: Any) -> Any:
        """Store step ``name``'s ``value`` (fenced), and return it as every later attempt reads it."""
        text = to_json(value, f"the result of step {name!r}", InvalidArgument, limit=settings.MAX_RESULT_BYTES,
                       limit_setting="TASKCLAIM_MAX_RESULT_BYTES", hint=". Store large outputs elsewhere")
        return self.store_text(name, text)

    def unstored(self, name: str) -> str | None:
        """The result of step ``name`` that this claim's call returned and could not store (a
        database error), to store now instead of calling the function again."""
        return self._unstored.get(name)

    def store_text(self, name: str, text: str) -> Any:
        """Store step ``name``'s result, JSON ``text`` (fenced); the result as later attempts read it."""
        claim = self.claim
        if claim.overran():
            claim._refuse("step")  # past the attempt's timeout: its end is TimedOut, and nothing is stored
        try:
            if not transitions.store_step(claim, name, text):
                # Fenced off, or a step of that name was stored already (the first one stands).
                if not transitions.check(claim):
                    claim._refuse("step")
                row = transitions.read_step(claim, name)
                if row is None:
                    raise TaskClaimError(f"step {name!r} of {claim.named()} was neither stored nor found")
                text = row.result
        except DbError:
            self._unstored[name] = text  # a failure to store never calls the function again
            raise
        self._unstored.pop(name, None)
        if transitions.in_transaction(claim.using):
            # Stored in the caller's transaction (fenced(), atomic(), autocommit off): known once it
            # commits. Rolled back, the step is not stored, and its next call runs it again. With
            # autocommit off and no atomic() Django has no commit hook: each later call reads it.
            self._uncommitted.add(name)
            if connections[claim.using].in_atomic_block:
                transaction.on_commit(lambda: self._remember(name, text), using=claim.using)
        else:
            self._remember(name, text)
        return json.loads(text)

    def _remember(self, name: str, text: str) -> None:
        with self._lock:
            self._uncommitted.discard(name)
            if self._stored is not None:
                self._stored.setdefault(name, text)

    # -- the steps ------------------------------------------------------------------------------
    def run(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
            timeout: float | None = None) -> Any:
        """``claim.step``: the stored result of step ``name``, else ``fn(*args, **kwargs)`` stored."""
        name, timeout = step_name(name), step_timeout(timeout)
        if not callable(fn):
            raise InvalidArgument(f"step {name!r} needs a function to call, not {fn!r}")
        found, result = self.stored_result(name)
        if found:
            return result
        if (text := self.unstored(name)) is not None:
            return self.store_text(name, text)
        began = time.monotonic()
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            if inspect.iscoroutine(value):
                value.close()  # never awaited: no "coroutine was never awaited" warning on top
            raise InvalidArgument(f"step {name!r}: its function returned an awaitable; "
                                  "await claim.astep(...) for a coroutine function")
        if timeout is not None and time.monotonic() - began > timeout:
            # A sync function cannot be stopped: past its timeout, what it returned is not stored.
            raise self._timed_out(name, timeout)
        return self.store(name, value)

    async def arun(self, name: str, afn: Callable[..., Awaitable[Any]], args: tuple[Any, ...],
                   kwargs: dict[str, Any], timeout: float | None = None) -> Any:
        """``claim.astep``: as :meth:`run`, awaiting ``afn``; past ``timeout`` it is cancelled."""
        name, timeout = step_name(name), step_timeout(timeout)
        if not callable(afn):
            raise InvalidArgument(f"step {name!r} needs a function to call, not {afn!r}")
        found, result = await sync_to_async(self.stored_result)(name)
        if found:
            return result
        if (text := self.unstored(name)) is not None:
            return await sync_to_async(self.store_text)(name, text)
        value = afn(*args, **kwargs)
        if inspect.isawaitable(value):
            if timeout is None:
                value = await value
            else:
                limit = asyncio.timeout(timeout)
                try:
                    async with limit:
                        value = await value
                except TimeoutError:
                    if not limit.expired():
                        raise  # the function's own TimeoutError, not the step's
                    raise self._timed_out(name, timeout) from None
        return await sync_to_async(self.store)(name, value)

    def _timed_out(self, name: str, timeout: float) -> TimedOut:
        return TimedOut(f"step {name!r} ran past its timeout of {timeout:g} s (nothing stored): {self.claim.named()}")
