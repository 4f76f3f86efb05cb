"""Every bound the claim API or the worker enforces is a usage error (exit 2) at the parser of
every command, with a message that names the bound: never a traceback, with or without --json."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

pytestmark = pytest.mark.django_db

HANDLER = "tests.programs.worker_handlers.effect"
LONG = "x" * 256

# (arguments, words the message must hold). Each bound is the API's: the minimum lease and
# TASKCLAIM_MAX_LEASE (604800 s by default), counts from 1 to 2**31 - 1, texts of 255 characters.
OUT_OF_RANGE = [
    (["taskclaim_worker", HANDLER, "--lease", "0.05"], "shorter than the minimum of 0.1 s"),
    (["taskclaim_worker", HANDLER, "--lease", "700000"], "longer than TASKCLAIM_MAX_LEASE (604800 s)"),
    (["taskclaim_worker", HANDLER, "--lease", "inf"], "positive, finite"),
    (["taskclaim_worker", HANDLER, "--lease", "nan"], "positive, finite"),
    (["taskclaim_worker", HANDLER, "--lease", "0"], "positive, finite"),
    (["taskclaim_worker", HANDLER, "--lease", "soon"], "not a number of seconds"),
    (["taskclaim_worker", HANDLER, "--batch", "0"], "must be 1 or more"),
    (["taskclaim_worker", HANDLER, "--batch", str(2**31)], "at most 2147483647"),
    (["taskclaim_worker", HANDLER, "--max-tasks", "0"], "must be 1 or more"),
    (["taskclaim_worker", HANDLER, "--owner", LONG], "the limit is 255"),
    (["taskclaim_worker", HANDLER, "--tenant", LONG], "the limit is 255"),
    (["taskclaim_reclaim", "--limit", "0"], "must be 1 or more"),
    (["taskclaim_reclaim", "--batch-size", str(2**31)], "at most 2147483647"),
    (["taskclaim_reclaim", "--every", "0"], "greater than zero"),
    (["taskclaim_reclaim", "--every", "1e9"], "at most 31536000, one year"),
    (["taskclaim_reclaim", "--requeue-after", "-1"], "greater than zero"),
    (["reclaim", "--limit", "0"], "must be 1 or more"),
    (["taskclaim_inspect", LONG], "the limit is 255"),
    (["taskclaim_inspect", "k", "--tenant", LONG], "the limit is 255"),
    (["taskclaim_audit", "--limit", "0"], "must be 1 or more"),
    (["taskclaim_audit", "--since", "0d"], "longer than zero"),
    (["taskclaim_purge", "--older-than", "0d"], "longer than zero"),
    (["taskclaim_purge", "--older-than", "1d", "--batch-size", "0"], "must be 1 or more"),
    (["taskclaim_purge", "--older-than", "1d", "--status", "running"], "never purged"),
]



@pytest.mark.parametrize(("args", "message"), OUT_OF_RANGE)
def test_out_of_range_values_are_usage_errors_from_call_command(args: list[str], message: str) -> None:
    for extra in ([], ["--json"]):
        out = io.StringIO()
        with pytest.raises(CommandError) as info:
            call_command(*args, *extra, stdout=out, stderr=io.StringIO())
        assert info.value.returncode == 2 and message in str(info.value), str(info.value)
        assert out.getvalue() == ""  # nothing ran


# A real `manage.py` process per command line (and both leases of the report), with and without
# --json: forked from one that set Django up once (the `command_line` fixture).
ON_THE_COMMAND_LINE = [OUT_OF_RANGE[0], OUT_OF_RANGE[1], *(
    next(case for case in OUT_OF_RANGE if case[0][0] == name)
    for name in ("taskclaim_reclaim", "reclaim", "taskclaim_inspect", "taskclaim_audit", "taskclaim_purge"))]


@pytest.mark.parametrize(("args", "message"), ON_THE_COMMAND_LINE)
def test_out_of_range_values_are_usage_errors_on_the_command_line(command_line, args, message) -> None:  # type: ignore[no-untyped-def]
    done = command_line(*args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr
    with_json = command_line(*args, "--json")
    assert with_json.returncode == 2, with_json.stderr
    assert "Traceback" not in with_json.stderr, with_json.stderr
    doc = json.loads(with_json.stdout)
    assert doc["returncode"] == 2 and message in doc["error"], doc


@pytest.mark.django_db(transaction=True)  # the worker closes old connections between rounds
def test_the_lease_bound_is_the_setting_read_at_call_time() -> None:
    with override_settings(TASKCLAIM_MAX_LEASE=60), pytest.raises(CommandError) as info:
        call_command("taskclaim_worker", HANDLER, "--lease", "61", stdout=io.StringIO())
    assert info.value.returncode == 2 and "TASKCLAIM_MAX_LEASE (60 s)" in str(info.value)
    with override_settings(TASKCLAIM_MAX_LEASE=2_000_000):  # longer than the default maximum: accepted
        out = io.StringIO()
        call_command("taskclaim_worker", HANDLER, "--lease", "700000", "--until-drained", "--json", stdout=out)
    assert json.loads(out.getvalue()) == {"succeeded": 0, "failed": 0, "fenced_off": 0, "unrecorded": 0}
