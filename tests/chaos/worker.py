"""The worker program of the harness: ``python -m tests.chaos.worker --tag w3 --lease 2 …``.

It claims tasks queue-style and executes each in ``--steps`` steps. The work of each step but the
last is a durable step (``claim.step("stepN", ...)``: its call reported as a ``step_call`` event, its
result stored under the task, and not called again by a later attempt: the checker counts the
calls). Every step (after a heartbeat, half of the time) writes one ``Effect`` row inside
``claim.fenced()``; the last
step writes the final effect and ``claim.complete()`` in the same fenced transaction (the
exactly-once recipe). With ``--downstream URL`` the last step first calls the downstream directly with
``claim.headers("direct")`` and records an outbox message with the completion
(tests/chaos/downstream.py). It prints one JSON line per event on stdout, which the harness reads
(the "replies").

With ``--mark-start`` (the harness's ``--limits``) each execution first writes a fenced ``start``
effect, before any work: the checker measures executions of limited tasks from it
(tests/chaos/limits.py).

With ``--concurrency N`` it runs N such loops at once, each on a thread with its own database
connection (as ``taskclaim_worker --concurrency`` runs sync tasks), so that a SIGKILL or SIGSTOP of
the process strikes N claims in hand at once.

Faults it takes part in:

- ``CHAOS_CRASH="after_claim=0.02,before_commit=0.02,after_commit=0.02"``: SIGKILL itself at
  those points with those probabilities (after the claim; after the final effect and the
  completion but before the commit; after the commit but before the ``done`` reply);
- the control channel on stdin: ``timeout`` sets a 1 ms ``statement_timeout`` and
  ``lock_timeout`` on its PostgreSQL session (until the next error makes it reconnect);
  ``stop`` makes it exit once idle;
- database errors of any kind (terminated backend, server restart, cancelled statement) are
  reported, the connection is closed and opened again, and the work goes on: the same claim is
  tried again while it may still be valid, which is how a commit whose reply was lost turns
  into a refused (stale) write instead of a second effect.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from devtools.events import emit
from tests.chaos.downstream import direct_path, outbox_path

DB_RETRIES = 3


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.owner = f"{args.tag}:{os.getpid()}"
        self.rng = random.Random(f"{os.environ.get('CHAOS_SEED', '0')}:{args.tag}:{os.getpid()}")
        self.crash = parse_crash(os.environ.get("CHAOS_CRASH", ""))
        self.stopping = threading.Event()
        self.timeout_wanted = threading.Event()

    # -- control channel ------------------------------------------------------------------
    def listen(self) -> None:
        for line in sys.stdin:
            command = line.strip()
            if command == "timeout":
                self.timeout_wanted.set()
            elif command == "stop":
                self.stopping.set()
        self.stopping.set()  # the harness went away

    def apply_controls(self) -> None:
        from django.db import connection

        if self.timeout_wanted.is_set() and connection.vendor == "postgresql":
            self.timeout_wanted.clear()
            with connection.cursor() as cursor:
                cursor.execute("SET statement_timeout = 1")
                cursor.execute("SET lock_timeout = 1")
            emit(event="timeout_set")

    # -- faults ---------------------------------------------------------------------------
    def maybe_crash(self, point: str, **where: Any) -> None:
        p = self.crash.get(point, 0.0)
        if p and self.rng.random() < p:
            emit(event="crash", point=point, **where)
            os.kill(os.getpid(), signal.SIGKILL)

    def reconnect(self, where: str, exc: BaseException, **info: Any) -> None:
        from django.db import Error, connection

        emit(event="dberror", where=where, error=type(exc).__name__, message=str(exc)[:200], **info)
        try:
            connection.close()
        except Error as close_exc:  # the socket is gone; the wrapper is reset either way
            emit(event="dberror", where="close", error=type(close_exc).__name__,
                 message=str(close_exc)[:200])
        delay = 0.05
        while not self.stopping.is_set():
            try:
                connection.ensure_connection()
                return
            except Error as again:
                emit(event="dberror", where="connect", error=type(again).__name__,
                     message=str(again)[:200])
                time.sleep(delay)  # back-off while the server is down: no event to wait for
                delay = min(delay * 2, 1.0)

    # -- the loop -------------------------------------------------------------------------
    def run(self) -> None:
        from django.db import Error, connection

        threading.Thread(target=self.listen, daemon=True).start()
        try:
            connection.ensure_connection()
        except Error as exc:
            self.reconnect("start", exc)
        emit(event="start", pid=os.getpid(), owner=self.owner, wall=time.time())
        if self.args.concurrency == 1:
            self.loop()
        else:  # --concurrency N: N loops at once, each on a thread of its own with its own connection
            slots = [threading.Thread(target=self.slot, name=f"slot-{i}") for i in range(self.args.concurrency)]
            for thread in slots:
                thread.start()
            for thread in slots:
                thread.join()
        emit(event="exit")

    def slot(self) -> None:
        from django.db import connection

        try:
            self.loop()
        finally:
            connection.close()

    def loop(self) -> None:
        """Claim and execute until told to stop (one task in hand at a time on this thread)."""
        from django.db import Error

        from django_taskclaim.models import Task

        while not self.stopping.is_set():
            try:
                self.apply_controls()
                # Now and then a batch: the later claims of a batch wait under their leases.
                claims = Task.objects.claim_next(owner=self.owner, lease=self.args.lease,
                                                 limit=self.rng.choice((1, 1, 1, 2, 3)))
            except Error as exc:
                self.reconnect("claim_next", exc)
                continue
            if not claims:
                time.sleep(self.args.idle)  # idle poll of the queue
                continue
            for claim in claims:
                info = {"task": claim.task_id, "key": claim.key, "token": claim.token, "owner": self.owner}
                emit(event="claimed", expires=claim.lease_expires_at, **info)
            for claim in claims:
                info = {"task": claim.task_id, "key": claim.key, "token": claim.token, "owner": self.owner}
                self.maybe_crash("after_claim", **info)
                self.execute(claim, info)

    def work(self) -> None:
        time.sleep(self.args.work_ms / 1000 * self.rng.uniform(0.5, 1.5))  # simulated work

    def execute_unsafe(self, claim: Any, info: dict[str, Any]) -> None:
        """The broken recipe, to show the checker catches it: the effect outside ``fenced()``."""
        from django_taskclaim.exceptions import StaleClaim
        from django_taskclaim.store import DbNow
        from tests.testapp.models import Effect

        # The broken recipe downstream: an idempotency key per owner (its token in the effect
        # name), and the work after the call, so that a takeover calls again.
        if self.args.downstream and not self.call_downstream(claim, info, effect=f"direct-{claim.token}"):
            return
        self.work()
        effect = Effect.objects.create(task_key=claim.key, token=claim.token,
                                       worker=f"{self.owner}#final")
        Effect.objects.filter(pk=effect.pk).update(created_at=DbNow())
        try:
            claim.complete({"owner": self.owner, "token": claim.token})
        except StaleClaim as exc:
            emit(event="stale", action=exc.action, step=0, **info)
            return
        emit(event="done", **info)

    def execute(self, claim: Any, info: dict[str, Any]) -> None:
        if self.args.unsafe:
            self.execute_unsafe(claim, info)
            return
        from django.db import Error

        from django_taskclaim.exceptions import StaleClaim
        from django_taskclaim.store import DbNow
        from tests.testapp.models import Effect

        steps: list[int | str] = ["start"] if self.args.mark_start else []
        for step in [*steps, *range(self.args.steps)]:
            final = step == self.args.steps - 1
            durable = step != "start" and not final  # its work is a durable step (stored once)
            if step != "start" and not durable:
                self.work()
            if final and self.rng.random() < self.args.give_up:
                self.give_up(claim, info)
                return
            if final and self.args.downstream and not self.call_downstream(claim, info):
                return
            for attempt in range(DB_RETRIES + 1):
                try:
                    if durable:
                        claim.step(effect_name(step), self.call, claim, step, info)
                    # Half the steps go straight to the fenced write, so that a worker resumed
                    # after a pause meets the refusal there as well as in a heartbeat.
                    if step != "start" and self.rng.random() < 0.5:
                        expires = claim.heartbeat()
                        emit(event="beat", expires=expires, **info)
                    with claim.fenced():
                        effect = Effect.objects.create(
                            task_key=claim.key, token=claim.token,
                            worker=f"{self.owner}#{'final' if final else effect_name(step)}")
                        # Stamped with the database clock, inside the transaction: the
                        # checker places each effect within its claim's interval.
                        Effect.objects.filter(pk=effect.pk).update(created_at=DbNow())
                        if final:
                            if self.args.downstream:
                                # Recorded with the completion: it exists only if this owner
                                # still held the task when the transaction committed.
                                claim.outbox.http("POST", self.args.downstream + outbox_path(claim.key),
                                                  json={"task": claim.key}, effect="chaos")
                            claim.complete({"owner": self.owner, "token": claim.token})
                            self.maybe_crash("before_commit", **info)
                    break
                except StaleClaim as exc:
                    emit(event="stale", action=exc.action, step=step, **info)
                    return
                except Error as exc:
                    if attempt == DB_RETRIES:
                        emit(event="abandon", step=step, **info)
                        self.reconnect(f"step{step}", exc, **info)
                        return
                    self.reconnect(f"step{step}", exc, **info)
            if not final:
                emit(event="step", step=step, **info)
        self.maybe_crash("after_commit", **info)
        emit(event="done", **info)


    def call(self, claim: Any, step: int, info: dict[str, Any]) -> str:
        """A step's work, run by ``claim.step``: reported (``step_call``) once it is done, so that the
        checker can count the calls of each step across the task's attempts."""
        self.work()
        emit(event="step_call", step=effect_name(step), **info)
        return f"{effect_name(step)} by {claim.token}"

    def call_downstream(self, claim: Any, info: dict[str, Any], effect: str = "direct") -> bool:
        """The direct call (``--downstream``): POST to the downstream with ``claim.headers()``.

        Whether to go on and complete: a 409 means a newer owner has called (this one is
        fenced off), any answer but 2xx leaves the task to its next owner once the lease ends.
        """
        body = json.dumps({"task": claim.key}).encode()  # the same for every owner: a repeat replays
        request = urllib.request.Request(  # noqa: S310 (the harness's own http URL)
            self.args.downstream + direct_path(claim.key), body,
            {**claim.headers(effect), "Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
                status, replayed = response.status, bool(response.headers.get("Idempotent-Replayed"))
        except urllib.error.HTTPError as exc:
            status, replayed = exc.code, False
        except OSError as exc:
            emit(event="direct", status=0, error=str(exc)[:200], **info)
            return False
        emit(event="direct", status=status, replayed=replayed, **info)
        return 200 <= status < 300

    def give_up(self, claim: Any, info: dict[str, Any]) -> None:
        """The task's own failure (retried later) or a release: the task goes back to PENDING."""
        from django.db import Error

        from django_taskclaim.exceptions import StaleClaim

        release = self.rng.random() < 0.5
        for attempt in range(DB_RETRIES + 1):
            try:
                if release:
                    claim.release()
                    emit(event="released", **info)
                else:
                    status = claim.fail("injected failure", retry=True)
                    emit(event="failed", status=status, **info)
                return
            except StaleClaim as exc:
                emit(event="stale", action=exc.action, step="give_up", **info)
                return
            except Error as exc:
                self.reconnect("give_up", exc, **info)
                if attempt == DB_RETRIES:
                    emit(event="abandon", step="give_up", **info)


def effect_name(step: int | str) -> str:
    """The name of a non-final effect (after the owner and ``#``): ``start`` for the write right
    after the claim (``--mark-start``), ``step0``, ``step1`` … for the steps."""
    return step if isinstance(step, str) else f"step{step}"


def parse_crash(spec: str) -> dict[str, float]:
    points = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, value = part.partition("=")
        if name not in ("after_claim", "before_commit", "after_commit"):
            raise SystemExit(f"CHAOS_CRASH: unknown crash point {name!r}")
        try:
            points[name] = float(value)
        except ValueError:
            raise SystemExit(f"CHAOS_CRASH: {part!r} is not point=probability") from None
    return points


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.worker")
    parser.add_argument("--tag", required=True)
    parser.add_argument("--lease", type=float, required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--work-ms", type=float, default=100)
    parser.add_argument("--idle", type=float, default=0.05)
    parser.add_argument("--concurrency", type=int, default=1,
                        help="tasks in hand at once: as many claim-and-execute loops, each on a thread")
    parser.add_argument("--give-up", type=float, default=0.0,
                        help="probability that an execution fails (retry) or releases instead")
    parser.add_argument("--downstream", default="",
                        help="the downstream's base URL: make a direct call with claim.headers() "
                             "and record an outbox message with each completion")
    parser.add_argument("--mark-start", action="store_true",
                        help="write a fenced 'start' effect right after each claim, before any work: "
                             "the checker measures each execution of a limited task from it (--limits)")
    parser.add_argument("--unsafe", action="store_true",
                        help="write the effect outside fenced() (to prove the checker fails)")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.chaos.settings")
    import django

    django.setup()
    Worker(args).run()


if __name__ == "__main__":
    main()
