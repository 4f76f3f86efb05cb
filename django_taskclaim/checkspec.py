"""The system checks' IDs, messages and hints, and the one list of every ID declared.

Each check lives with what it checks: the app's settings in ``checks.py``, each database in its
store (``Store.system_check``), each integration in its folder (``contrib.INTEGRATIONS``). Each declares
its IDs with :func:`spec`, which refuses an ID declared twice: an ID is never reused.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from django.core import checks


class CheckSpec(NamedTuple):
    """One check ID with its message and hint, both ``str.format`` templates."""

    id: str
    msg: str
    hint: str

    def error(self, **fmt: Any) -> checks.Error:
        return checks.Error(self.msg.format(**fmt), hint=self.hint.format(**fmt), id=self.id)

    def warning(self, **fmt: Any) -> checks.Warning:
        return checks.Warning(self.msg.format(**fmt), hint=self.hint.format(**fmt), id=self.id)


#: Every check ID declared so far (by the modules imported so far), in declaration order.
SPECS: dict[str, CheckSpec] = {}


def spec(check_id: str, msg: str, hint: str) -> CheckSpec:
    """Declare check ``check_id``; ``RuntimeError`` if another place declared it already."""
    if check_id in SPECS:
        raise RuntimeError(f"system check ID {check_id} is declared twice")
    found = SPECS[check_id] = CheckSpec(check_id, msg, hint)
    return found
