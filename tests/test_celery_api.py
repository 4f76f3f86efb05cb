"""The Celery bridge in-process: decoration, identity, duplicates, enqueue_once, requeue selection.

No broker is needed here: claimed tasks are called directly (Celery's ``called_directly``),
which runs them under a claim like a worker does.
"""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

pytestmark = pytest.mark.django_db(transaction=True)


def test_reclaim_command_runs_with_default_verbosity() -> None:
    # Regression: reclaim_round read self.verbosity, which BaseCommand.execute() never sets.
    out = io.StringIO()
    call_command("reclaim", stdout=out)
    assert "reclaim: 0 expired task(s)" in out.getvalue()
