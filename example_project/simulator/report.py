"""What the demo prints: its progress lines, and the summary checked against the database."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO


class Log:
    """Timestamped progress lines (``--quiet`` keeps the chaos alone); agents' threads share it."""

    def __init__(self, quiet: bool, out: TextIO = sys.stdout) -> None:
        self.quiet, self.out, self.t0 = quiet, out, time.monotonic()
        self.lock = threading.Lock()

    def __call__(self, who: str, what: str, detail: str = "", *, always: bool = False) -> None:
        if self.quiet and not always:
            return
        with self.lock:
            print(
                f"{time.monotonic() - self.t0:6.2f}s  {who:<9} {what:<10} {detail}".rstrip(),
                file=self.out,
                flush=True,
            )


def short(tenant: str, key: str) -> str:
    return f"{tenant}/{key}"


def summarize(
    run: str, jobs: list[tuple[str, str]], counts: dict[str, int], received: list[dict[str, Any]]
) -> dict[str, Any]:
    """Check the database and the artifacts: what happened to the jobs ``(tenant, key)`` of
    ``run``; did every one take effect once, here and in the registry (``received``: its rows)?"""
    from django.conf import settings
    from django.db.models import Count, Sum

    from django_taskclaim.models import Attempt, OutboxMessage, Task

    from ..testgen.models import TestSuite

    tasks = {(t.tenant, t.key): t for t in Task.objects.filter(key__startswith=f"{run}:")}
    attempts = Attempt.objects.filter(task__key__startswith=f"{run}:")
    suites: dict[tuple[str, str], list[TestSuite]] = {}
    for s in TestSuite.objects.filter(run=run):
        suites.setdefault((s.tenant, s.job_key), []).append(s)
    lost, twice, published = [], [], 0
    for tenant, key in jobs:
        task, rows = tasks.get((tenant, key)), suites.get((tenant, key), [])
        if len(rows) > 1:
            twice.append(short(tenant, key))
        if task is None or task.status != Task.Status.SUCCEEDED or not rows:
            lost.append(short(tenant, key))
            continue
        row = rows[-1]
        if (
            task.result_ref
            and task.result_ref == row.artifact
            and row.token == task.fencing_token
            and (Path(settings.ARTIFACT_DIR) / task.result_ref).is_file()
        ):
            published += 1
    run_dir_files = {
        str(p.relative_to(settings.ARTIFACT_DIR))
        for p in Path(settings.ARTIFACT_DIR).glob(f"*/{run}/*.py")
    }
    referenced = {t.result_ref for t in tasks.values() if t.result_ref}
    # The other side: each published suite must be in the registry once, as the caller wrote it.
    arrived: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in received:
        arrived.setdefault((r["tenant"], r["job_key"]), []).append(r)
    registry_lost, registry_twice = [], []
    for (tenant, key), rows in suites.items():
        got = arrived.get((tenant, key), [])
        if len(got) > 1:
            registry_twice.append(short(tenant, key))
        row = rows[-1]
        if not any((g["token"], g["artifact"], g["tests"]) == (row.token, row.artifact, row.tests) for g in got):
            registry_lost.append(short(tenant, key))
    calls = model_calls(run, jobs, tasks)
    messages = dict(
        OutboxMessage.objects.filter(task_key__startswith=f"{run}:")
        .values_list("status")
        .annotate(n=Count("id"))
        .values_list("status", "n")
    )
    by_outcome = dict(
        attempts.values_list("outcome").annotate(n=Count("id")).values_list("outcome", "n")
    )
    return {
        "database": vendor(),
        "run": run,
        "jobs": len(jobs),
        "deliveries": counts["deliveries"],
        "redeliveries": counts["redeliveries"],
        "busy_retries": counts["retries"],
        "executions_started": attempts.filter(token__isnull=False).count(),
        "duplicates_refused": by_outcome.get("duplicate", 0),
        "takeovers": by_outcome.get("taken_over", 0) + by_outcome.get("expired", 0),
        "stale_writes_refused": attempts.aggregate(n=Sum("stale_writes"))["n"] or 0,
        "artifacts_published": published,
        "drafts_discarded": counts["drafts_discarded"] + len(run_dir_files - referenced),
        "lost": lost,
        "took_effect_twice": twice,
        "messages_delivered": messages.get(OutboxMessage.Status.DELIVERED, 0),
        "messages_failed": messages.get(OutboxMessage.Status.FAILED, 0),
        "messages_pending": messages.get(OutboxMessage.Status.PENDING, 0),
        "registry_artifacts": len(received),
        "registry_lost": registry_lost,
        "registry_twice": registry_twice,
        **calls,
        "ok": not calls["model_calls_repeated"]
        and not lost
        and not twice
        and published == len(jobs)
        and not registry_lost
        and not registry_twice
        and len(received) == len(jobs),
    }


def model_calls(run: str, jobs: list[tuple[str, str]], tasks: dict[tuple[str, str], Any]) -> dict[str, int]:
    """The model calls of ``run`` (each a durable step, recorded by ``drafts.model_call``):

    - ``model_calls``: every call made;
    - ``model_calls_repeated``: calls made again although their step was stored (by a claim whose
      token is later than the one that stored it, or twice by that one): must be 0;
    - ``model_calls_rerun``: calls made again because the agent that made them never stored them
      (killed or fenced off between the call's return and the store's commit: the documented window).
    """
    from django_taskclaim.models import Step

    from ..testgen.drafts import calls_dir, job_ref

    refs = {job_ref(tenant, key): (tenant, key) for tenant, key in jobs}
    made: dict[tuple[str, int], list[int]] = {}
    folder = calls_dir(run)
    for record in folder.iterdir() if folder.is_dir() else ():
        ref, number, token, *_ = record.name.split(".")
        made.setdefault((ref, int(number)), []).append(int(token.removeprefix("t")))
    stored = {(s.task_id, s.name): s.token for s in Step.objects.filter(task__key__startswith=f"{run}:")}
    repeated = rerun = 0
    for (ref, number), tokens in made.items():
        task = tasks.get(refs.get(ref, ("", "")))
        by = None if task is None else stored.get((task.pk, f"model-call-{number}"))
        if by is None:
            continue  # never stored: its job did not finish (reported as lost)
        repeated += max(0, tokens.count(by) - 1) + sum(1 for t in tokens if t > by)
        rerun += sum(1 for t in tokens if t < by)
    return {"model_calls": sum(len(t) for t in made.values()), "model_calls_repeated": repeated,
            "model_calls_rerun": rerun}


def vendor() -> str:
    from django.db import connection

    return str(connection.vendor)


def print_summary(s: dict[str, Any], out: TextIO = sys.stdout) -> None:
    """The summary table and the verdict (the README shows a sample of it)."""
    rows = [
        ("jobs", s["jobs"], f"on {s['database']}, run {s['run']}"),
        (
            "deliveries",
            s["deliveries"],
            s.get("deliveries_note")
            or f"incl. {s['redeliveries']} redelivered, {s['busy_retries']} busy retries",
        ),
        (
            "executions started",
            s["executions_started"],
            "claims: work may start again after a lease expires",
        ),
        (
            "duplicates refused",
            s["duplicates_refused"],
            "deliveries that found the job running or done",
        ),
        ("takeovers", s["takeovers"], "expired leases claimed by another agent"),
        (
            "stale writes refused",
            s["stale_writes_refused"],
            "writes by agents that had been fenced off",
        ),
        (
            "artifacts published",
            s["artifacts_published"],
            "= jobs, exactly" if s["artifacts_published"] == s["jobs"] else f"!= {s['jobs']} jobs",
        ),
        (
            "drafts discarded",
            s["drafts_discarded"],
            "work of paused/killed agents, never published",
        ),
        (
            "model calls",
            s["model_calls"],
            f"durable steps: {s['model_calls_repeated']} repeated once stored, "
            f"{s['model_calls_rerun']} run again (their agent died or was fenced off before storing)",
        ),
        (
            "messages delivered",
            s["messages_delivered"],
            f"outbox -> registry by the relays ({s['messages_failed']} failed, "
            f"{s['messages_pending']} pending)",
        ),
        (
            "registry artifacts",
            s["registry_artifacts"],
            "in the second service's database"
            + (", each exactly once" if s["registry_artifacts"] == s["jobs"] and not s["registry_twice"]
               and not s["registry_lost"] else f" (!= {s['jobs']} jobs)"),
        ),
    ]
    print("\nSummary", file=out)
    for label, n, note in rows:
        print(f"  {label:<22}{n:>5}   {note}", file=out)
    if s["lost"]:
        print(f"  LOST: {', '.join(s['lost'])}", file=out)
    if s["took_effect_twice"]:
        print(f"  TOOK EFFECT TWICE: {', '.join(s['took_effect_twice'])}", file=out)
    if s["registry_lost"]:
        print(f"  NOT IN THE REGISTRY: {', '.join(s['registry_lost'])}", file=out)
    if s["registry_twice"]:
        print(f"  IN THE REGISTRY TWICE: {', '.join(s['registry_twice'])}", file=out)
    if s["model_calls_repeated"]:
        print(f"  MODEL CALLS REPEATED AFTER THEIR STEP WAS STORED: {s['model_calls_repeated']}", file=out)
    print(
        "\n"
        + (
            "OK: every job took effect exactly once, here and in the registry; no stored model call ran again."
            if s["ok"]
            else "FAILED: a job was lost or took effect twice, or a stored model call ran again."
        ),
        file=out,
        flush=True,
    )


