"""Signals sent on every change of a task's ownership.

All are sent with ``sender=Task``. State-change signals are sent after the change commits
(``transaction.on_commit``), so a receiver never sees a change that was rolled back.

=========================  ==============================================================
Signal                     Keyword arguments
=========================  ==============================================================
``task_claimed``           ``claim`` (a :class:`~django_taskclaim.claims.Claim`), ``takeover`` (bool)
``task_taken_over``        ``claim``, ``previous_owner`` (str), ``previous_token`` (int)
``heartbeat_lost``         ``claim``, ``error`` (the exception that ended the keepalive)
``task_completed``         ``claim``, ``result``, ``result_ref``
``task_failed``            ``claim``, ``error`` (str), ``retry`` (bool: back to PENDING)
``task_released``          ``claim`` (``None`` when an operator forced it), ``key``, ``tenant``
``stale_write_refused``    ``key``, ``tenant``, ``token``, ``owner``, ``action`` (str)
``duplicate_delivery``     ``task`` (the Task as found), ``owner``, ``delivery_id``
``tasks_reclaimed``        ``tasks``: list of ``(key, tenant, token, new_status)``
=========================  ==============================================================
"""

from __future__ import annotations

from django.dispatch import Signal

task_claimed = Signal()
task_taken_over = Signal()
heartbeat_lost = Signal()
task_completed = Signal()
task_failed = Signal()
task_released = Signal()
stale_write_refused = Signal()
duplicate_delivery = Signal()
tasks_reclaimed = Signal()
