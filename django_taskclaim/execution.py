"""The public door for plug-ins: what an integration needs to run a body under a claim.

The Celery bridge, LangGraph nodes and the Django Tasks backend import from here (and from the
claim API, :mod:`django_taskclaim.claims`), never from ``lifecycle`` or ``store``: the rules
live in :mod:`django_taskclaim.lifecycle.execution`, and this module gives them their public names.

    outcome = run_by_key(lambda: claim(key, tenant, lease=60), run, on_busy="wait")

- :func:`execute` / :func:`aexecute` run a body under a claim with keepalive and end the claim
  by the one rule (:func:`conclude`); they return an :class:`Executed`. A :class:`Policy` says which
  errors retry, which release the claim, and whether the body's writes commit with the completion.
  A body that must end its claim before it returns (Celery's ``retry()``) calls ``conclude`` itself.
- :meth:`Executed.outcome` is the one reading of an execution: the value (the stored result when
  the body completed its claim itself), the error raised, or :class:`FencedOff` when the claim was
  fenced off — from there on the caller is a duplicate.
- :func:`run_by_key` / :func:`arun_by_key` are the claim-or-answer loop: claim, or answer a
  duplicate with the stored outcome (:func:`answer`), wait while another worker holds the task
  (:func:`wait_while_busy`), claim again when it came back. A run step returns
  ``execute(...).outcome()``; a :class:`FencedOff` is answered as a duplicate. :func:`answered`
  does that for a caller with no loop (``run_claimed``).
- :func:`current_claim` is the running body's claim, whichever integration runs it.
"""

from __future__ import annotations

from .lifecycle.claim import error_text
from .lifecycle.execution import (
    FENCED_OFF,
    ON_BUSY,
    WAIT,
    EndingRolledBack,
    Executed,
    FencedOff,
    Finish,
    Policy,
    aanswered,
    aexecute,
    answer,
    answered,
    arun_by_key,
    await_while_busy,
    check_on_busy,
    complete_or_fail,
    conclude,
    current_claim,
    current_claim_or_none,
    execute,
    record_failure,
    run_by_key,
    wait_while_busy,
)

__all__ = [
    "FENCED_OFF", "ON_BUSY", "WAIT", "EndingRolledBack", "Executed", "FencedOff", "Finish", "Policy", "aanswered",
    "aexecute", "answer", "answered", "arun_by_key", "await_while_busy", "check_on_busy", "complete_or_fail",
    "conclude", "current_claim", "current_claim_or_none", "error_text", "execute", "record_failure", "run_by_key",
    "wait_while_busy",
]
