"""The ``--downstream`` mode: a service beyond the database, and the checker of its effects.

``python -m tests.chaos.downstream DB_FILE``: the test project (``tests.urls``, its
``fenced_endpoint`` views) served over HTTP on a free port of 127.0.0.1, on a SQLite database of
its own (migrated at start; not the caller's database). A threaded wsgiref server: a client
paused mid-request (SIGSTOP) holds one thread, not the service. It says ``ready`` with its
port; on the line ``report`` it says ``report`` with every effect row it holds
(``task_key``, ``token``): each run of a view, committed with the view's fencing record.

Each task of the harness has two effects downstream (tests/chaos/worker.py):

- ``/downstream/pay/<key>/``: the outbox message recorded with the completion in ``fenced()``
  (effect ``chaos``), delivered by the ``taskclaim_relay`` processes;
- ``/downstream/pay/<key>~direct/``: a direct call with ``claim.headers("direct")`` made by
  the executing worker just before its completing fenced block.

``check_downstream`` judges both against the caller's final state.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import Counter, defaultdict
from typing import Any
from urllib.parse import quote

from devtools.events import emit

DIRECT = "~direct"


def outbox_path(key: str) -> str:
    return f"/downstream/pay/{quote(key, safe='')}/"


def direct_path(key: str) -> str:
    return f"/downstream/pay/{quote(key + DIRECT, safe='')}/"


def load_outbox() -> list[dict[str, Any]]:
    """The caller's outbox rows, as plain values (read by the harness after the quiet period)."""
    from django_taskclaim.models import OutboxMessage

    return list(OutboxMessage.objects.order_by("id").values(
        "id", "task_key", "token", "effect", "status", "attempts", "answer_status"))


def check_downstream(tasks: list[dict[str, Any]], outbox: list[dict[str, Any]],
                     effects: list[dict[str, Any]], events: list[dict[str, Any]],
                     enqueued: list[str]) -> tuple[dict[str, int], dict[str, list[str]]]:
    """The downstream's side of a run: figures and violations, by kind.

    - **downstream lost / twice**: every SUCCEEDED task's outbox effect and direct effect each
      took effect downstream exactly once; a task that did not succeed took no outbox effect;
    - **outbox**: every SUCCEEDED task recorded exactly one message, with the task's final
      token, and it ended ``delivered``;
    - **downstream token**: the outbox effect carries the task's final token; no effect carries
      a token above it;
    - **fenced-off call**: a direct call refused with 409 came from a token below the task's
      final one (the completing owner is never refused), and no direct call was answered 409
      after having taken effect — a refused call has no effect (its token is not the one of the
      effect row, unless that effect is the earlier, accepted call of the same owner).
    """
    violations: dict[str, list[str]] = defaultdict(list)
    final = {t["key"]: t for t in tasks}
    outbox_effects: dict[str, list[int]] = defaultdict(list)
    direct_effects: dict[str, list[int]] = defaultdict(list)
    for e in effects:
        key = e["task_key"]
        if key.endswith(DIRECT):
            direct_effects[key.removesuffix(DIRECT)].append(e["token"])
        else:
            outbox_effects[key].append(e["token"])
    messages: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for m in outbox:
        messages[m["task_key"]].append(m)

    lost = twice = 0
    for key in enqueued:
        task = final.get(key)
        succeeded = task is not None and task["status"] == "succeeded"
        token = task["fencing_token"] if task is not None else None
        got, direct = outbox_effects.get(key, []), direct_effects.get(key, [])
        if not succeeded:
            if got:
                violations["downstream twice"].append(
                    f"{key}: not succeeded, yet its outbox effect arrived {len(got)} time(s)")
            continue
        for name, tokens in (("outbox", got), ("direct", direct)):
            if not tokens:
                lost += 1
                violations["downstream lost"].append(f"{key}: {name} effect never arrived")
            elif len(tokens) > 1:
                twice += 1
                violations["downstream twice"].append(
                    f"{key}: {name} effect arrived {len(tokens)} times, tokens {tokens}")
            if any(t > token for t in tokens):
                violations["downstream token"].append(
                    f"{key}: {name} effect with token {max(tokens)} above the task's {token}")
        if got and got[0] != token:
            violations["downstream token"].append(
                f"{key}: outbox effect with token {got[0]}, the task completed with {token}")
        mine = messages.get(key, [])
        if len(mine) != 1:
            violations["outbox"].append(f"{key}: {len(mine)} outbox messages, not 1")
        for m in mine:
            if m["status"] != "delivered" or m["token"] != token:
                violations["outbox"].append(
                    f"{key}: message {m['id']} {m['status']} (answer {m['answer_status']}, "
                    f"{m['attempts']} attempts) with token {m['token']}, the task's is {token}")
    for key in set(outbox_effects) | set(direct_effects):
        if key not in final:
            violations["downstream twice"].append(f"{key}: an effect for a task never enqueued")

    answers: Counter[int] = Counter()
    refused_tokens: dict[str, set[int]] = defaultdict(set)
    for ev in events:
        if ev.get("event") != "direct":
            continue
        answers[ev["status"]] += 1
        if ev["status"] == 409:
            refused_tokens[ev["key"]].add(ev["token"])
    refused_calls = 0
    for key, tokens in refused_tokens.items():
        task = final.get(key)
        refused_calls += len(tokens)
        if task is not None and task["status"] == "succeeded" and task["fencing_token"] in tokens:
            violations["fenced-off call"].append(
                f"{key}: the completing owner's direct call (token {task['fencing_token']}) was refused")
        landed = sorted(tokens & set(direct_effects.get(key, [])))
        if landed:
            # A refused call writes nothing; an owner whose earlier call landed and was then
            # refused on a retry does not exist in the worker (one call per execution).
            violations["fenced-off call"].append(
                f"{key}: direct call(s) with token(s) {landed} refused (409), yet took effect")
    figures = {
        "outbox_messages": len(outbox),
        "outbox_deliveries": sum(m["attempts"] for m in outbox),
        "outbox_claimed_again": sum(1 for m in outbox if m["attempts"] > 1),
        "downstream_outbox_effects": sum(len(v) for v in outbox_effects.values()),
        "downstream_direct_effects": sum(len(v) for v in direct_effects.values()),
        "direct_calls": sum(answers.values()),
        "direct_calls_201": answers[201],
        "direct_calls_replayed": sum(1 for ev in events if ev.get("event") == "direct"
                                     and ev.get("replayed")),
        "direct_calls_refused_409": answers[409],
        "direct_calls_other": sum(n for s, n in answers.items() if s not in (201, 409)),
        "fenced_off_tokens_refused": refused_calls,
        "downstream_lost": lost,
        "downstream_twice": twice,
    }
    return figures, violations


def serve(db_file: str) -> None:
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    import django
    from django.core.management import call_command
    from django.db import connection

    django.setup()
    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode=WAL")  # readers (the report) never wait for a writer
    connection.close()
    from django.core.wsgi import get_wsgi_application

    from tests.testapp.models import Effect

    class Threaded(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
            pass

    server = make_server("127.0.0.1", 0, get_wsgi_application(), server_class=Threaded,
                         handler_class=Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    emit(event="ready", port=server.server_port, db=db_file)
    for line in sys.stdin:
        if line.strip() == "report":
            rows = list(Effect.objects.order_by("id").values("task_key", "token"))
            emit(event="report", effects=rows)
    server.shutdown()


def main() -> None:
    db_file = sys.argv[1]
    os.environ.update(DJANGO_SETTINGS_MODULE="tests.settings", TASKCLAIM_TEST_DB="sqlite",
                      TASKCLAIM_TEST_DB_NAME=db_file)
    serve(db_file)


if __name__ == "__main__":
    main()
