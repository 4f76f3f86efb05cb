"""``manage.py taskclaim_worker [HANDLER]``: a queue worker (see :mod:`django_taskclaim.worker`).

With a ``HANDLER`` it runs ``HANDLER(claim)`` on the work queued for a handler; with none it
runs the Django tasks that a ``ClaimBackend`` (``--backend``) enqueued.
"""

from __future__ import annotations

import threading
from typing import Any

from django.core.management.base import CommandError, CommandParser, SystemCheckError
from django.utils.module_loading import import_string

from django_taskclaim import routing
from django_taskclaim.exceptions import InvalidArgument, TaskClaimError
from django_taskclaim.management.arguments import (
    lease,
    owner_name,
    positive_int,
    positive_seconds,
    queue_arg,
    task_database,
    tenant_name,
)
from django_taskclaim.management.base import USAGE_ERROR, TaskClaimCommand, dumps
from django_taskclaim.stopping import Stop
from django_taskclaim.supervisor import (
    HARD_TIMEOUT_GRACE,
    OVERTIME,
    give_up_stuck,
    graceful_stop,
    mark_ready,
    supervise,
    supervised,
)
from django_taskclaim.values import MIN_LEASE, lease_seconds
from django_taskclaim.worker import DUE, HandlerRunner, work
from django_taskclaim.worker_runners import runner_without_handler


class Command(TaskClaimCommand):
    help = (
        "Claim queued tasks (due PENDING ones by priority, or RUNNING with an expired lease) of the "
        "named queues and run each: HANDLER(claim), or with no handler the Django task it names "
        "(the tasks of a ClaimBackend); one commit per task. On SIGTERM/SIGINT stops claiming, finishes the "
        "task in hand within --grace and gives back what it did not start."
    )

    def check(self, *args: Any, **kwargs: Any) -> None:
        """The system checks every command runs first; an error among them refuses to start the
        worker as a usage error (exit 2), before it claims anything with what it cannot use."""
        try:
            super().check(*args, **kwargs)
        except SystemCheckError as exc:
            raise SystemCheckError(str(exc), returncode=USAGE_ERROR) from exc

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("handler", nargs="?", default=None,
                            help="Dotted path of a callable taking the claim and returning the result. "
                                 "Without it: run the Django tasks of --backend.")
        parser.add_argument("--queue", action="append", type=queue_arg, default=None, dest="queues", metavar="QUEUE",
                            help="A queue to take tasks from; repeat for several (default: 'default' with a "
                                 "handler, the backend's QUEUES without).")
        parser.add_argument("--backend", default="default",
                            help="The Django task backend (a ClaimBackend) whose tasks to run, without a "
                                 "handler (default: %(default)r).")
        parser.add_argument("--tenant", type=tenant_name, default=None, help="Only this tenant's tasks.")
        parser.add_argument("--database", type=task_database, default=None, metavar="ALIAS",
                            help="Only the tasks of this task database (default: the tenant's with --tenant, "
                                 "else every one of TASKCLAIM_DATABASES in turn).")
        parser.add_argument("--lease", type=lease, default=None,
                            help=f"Lease in seconds, from {MIN_LEASE:g} to TASKCLAIM_MAX_LEASE "
                                 "(default: TASKCLAIM_DEFAULT_LEASE, or the backend's LEASE).")
        parser.add_argument("--batch", type=positive_int, default=None,
                            help="Tasks claimed at a time, at most (default: 1; with --concurrency N, as many "
                                 "as N, 16 at most: a claim takes only what the free slots run at once).")
        parser.add_argument("--concurrency", type=positive_int, default=1,
                            help="Tasks in flight at once in this process: sync ones on as many threads, "
                                 "async ones on one event loop (default: 1).")
        parser.add_argument("--timeout", type=positive_seconds, default=None,
                            help="With a handler: seconds an attempt may run before its claim is fenced off and "
                                 "it is recorded as failed with TimedOut (default: none). Django tasks take "
                                 "OPTIONS['TIMEOUT'] or @claim_options(timeout=...).")
        parser.add_argument("--max-tasks", type=positive_int, default=None, help="Stop after this many tasks.")
        parser.add_argument("--until-drained", action="store_true",
                            help="Stop once no task of these queues is left unfinished (pending, or running "
                                 "elsewhere), deferred ones too: a task not before an hour from now is waited "
                                 "for (see --until-drained=due).")
        # An option string of its own (argparse matches it whole before it splits at "="), so that
        # "--until-drained HANDLER" still reads HANDLER as the handler.
        parser.add_argument("--until-drained=due", dest="until_drained", action="store_const", const=DUE,
                            help="Stop once no task of these queues is due now or running elsewhere; tasks "
                                 "deferred to a later time are left for a later run.")
        parser.add_argument("--atomic", action="store_true",
                            help="Run the handler inside claim.fenced(): its writes commit with the completion.")
        parser.add_argument("--owner", type=owner_name, default=None,
                            help="Worker identity, 255 characters at most (default: host:pid:random).")
        parser.add_argument("--schedule", action="store_true",
                            help="Also fire the ticks of TASKCLAIM_SCHEDULES, in a thread (as taskclaim_scheduler).")
        parser.add_argument("--processes", type=positive_int, default=None,
                            help="Run this many worker processes under a supervisor that restarts one that "
                                 "dies (default: none; this process is the one worker).")
        parser.add_argument("--grace", type=positive_seconds, default=None,
                            help="Seconds the tasks in hand have to finish after SIGTERM/SIGINT; then the "
                                 "process exits (a supervisor kills its children) and they come back after "
                                 "their lease (default: the lease).")
        parser.add_argument("--hard-timeout-grace", type=positive_seconds, default=None, metavar="S",
                            help="With --processes: a worker process whose sync task is still running S seconds "
                                 "past its timeout (fenced off then, recorded TimedOut, but its thread cannot be "
                                 "stopped) stops claiming, gives its other tasks S seconds more to finish, releases "
                                 "the claims it did not start, and exits; the supervisor starts another "
                                 f"(default: {HARD_TIMEOUT_GRACE:g}; an attempt past its timeout is already fenced "
                                 "off, so this only bounds how long its thread may hold a slot).")
        self.add_json_argument(parser)

    def handle(self, *args: Any, handler: str | None, queues: list[str] | None, backend: str, tenant: str | None,
               lease: float | None, batch: int | None, max_tasks: int | None, until_drained: bool | str, atomic: bool,
               owner: str | None, as_json: bool = False, database: str | None = None, concurrency: int = 1,
               timeout: float | None = None, schedule: bool = False, processes: int | None = None,
               grace: float | None = None, hard_timeout_grace: float | None = None, **options: Any) -> None:
        runner: Any
        if tenant is not None:
            try:
                routing.route(tenant, database)
            except TaskClaimError as exc:  # --database that does not hold the tenant's tasks
                raise CommandError(str(exc), returncode=USAGE_ERROR) from exc
        if handler is None:  # the runner a plug-in registered (the Django Tasks backend's)
            if timeout is not None:
                raise CommandError("--timeout is for a handler worker: a Django task takes its timeout from "
                                   "OPTIONS['TIMEOUT'] or @claim_options(timeout=...)", returncode=USAGE_ERROR)
            try:
                runner, queue, lease = runner_without_handler(backend=backend, queues=queues, lease=lease,
                                                              atomic=atomic)
            except InvalidArgument as exc:
                raise CommandError(str(exc), returncode=USAGE_ERROR) from exc
        else:
            runner, queue = self._handler(handler, atomic), queues or ["default"]
        grace = lease_seconds(getattr(runner, "lease", None) if lease is None else lease) if grace is None else grace
        if hard_timeout_grace is not None and processes is None and not supervised():
            raise CommandError("--hard-timeout-grace is for --processes: a worker whose sync task is stuck exits, "
                               "and only a supervisor starts another", returncode=USAGE_ERROR)
        if processes is not None:
            self._supervise(processes, grace, as_json, dict(
                options, handler=handler, queues=queues, backend=backend, tenant=tenant, lease=lease, batch=batch,
                max_tasks=max_tasks, until_drained=until_drained, atomic=atomic, owner=owner, as_json=as_json,
                database=database, grace=grace, concurrency=concurrency, timeout=timeout, schedule=schedule,
                hard_timeout_grace=HARD_TIMEOUT_GRACE if hard_timeout_grace is None else hard_timeout_grace))
            return
        stop = Stop()  # set by a signal handler: an Event's set() there can wait for ever
        scheduler = None
        with graceful_stop(stop, grace):
            try:
                if schedule:  # a scheduler loop in a thread, stopped with the worker (the same event)
                    scheduler = self._schedule(stop)
                mark_ready()  # its options taken: from here an exit 2 is a death (a task's), not a refusal
                stats = work(runner, owner=owner, lease=lease, tenant=tenant, queue=queue, batch=batch,
                             max_tasks=max_tasks, until_drained=until_drained, atomic=atomic, stop=stop,
                             using=database, concurrency=concurrency, timeout=timeout,
                             hard_timeout_grace=hard_timeout_grace,
                             on_stuck=None if hard_timeout_grace is None else give_up_stuck)
            finally:
                stop.set()
                if scheduler is not None:
                    scheduler.join(5)  # its round in hand (a statement a tick) ends; it closes its connection
        # Tasks by how they ended; then, only where there were any (the report of a worker without
        # them is unchanged), attempts: timed out, and failed with attempts left (their task ran again).
        summary = {"succeeded": stats.succeeded, "failed": stats.failed, "fenced_off": stats.fenced_off,
                   "unrecorded": stats.unrecorded}
        if stats.timed_out:
            summary["timed_out"] = stats.timed_out
        if stats.retried:
            summary["retried"] = stats.retried
        if as_json:
            self.write_json(summary, indent=None)
        else:
            self.stdout.write(f"taskclaim_worker: {stats.succeeded} succeeded, {stats.failed} failed, "
                              f"{stats.fenced_off} fenced off, {stats.unrecorded} unrecorded"
                              + (f", {stats.timed_out} timed out" if stats.timed_out else "")
                              + (f", {stats.retried} failed attempts retried" if stats.retried else ""))

    def _supervise(self, processes: int, grace: float, as_json: bool, options: dict[str, Any]) -> None:
        """Run the worker in ``processes`` child processes (``django_taskclaim.supervisor``)."""
        for name in ("stdout", "stderr", "processes"):  # streams stay here; each child is one worker
            options.pop(name, None)
        options["skip_checks"] = True  # checked here, once

        def report(**event: Any) -> None:  # --json: one line per start, death, restart and stop, as they happen
            if as_json:
                self.stdout.write(dumps(event))
                self.stdout.flush()

        code = supervise(options, processes, grace, report)
        if code:
            why = "a worker was still busy after the grace" if code == OVERTIME else "a worker refused its options"
            raise CommandError(f"taskclaim_worker: {why} (exit code {code})", returncode=code)

    @staticmethod
    def _schedule(stop: threading.Event) -> threading.Thread:
        from django_taskclaim.schedules import ScheduleError
        from django_taskclaim.schedules.firing import run_in_thread

        try:
            return run_in_thread(stop)
        except ScheduleError as exc:
            raise CommandError(str(exc), returncode=USAGE_ERROR) from exc

    @staticmethod
    def _handler(handler: str, atomic: bool) -> Any:
        try:
            func = import_string(handler)
        except ImportError as exc:
            raise CommandError(f"handler {handler!r} cannot be imported: {exc}", returncode=USAGE_ERROR) from exc
        if not callable(func):
            raise CommandError(f"handler {handler!r} is not callable", returncode=USAGE_ERROR)
        try:
            return HandlerRunner(func, atomic=atomic)
        except InvalidArgument as exc:  # an async handler with --atomic
            raise CommandError(f"handler {handler!r}: {exc}", returncode=USAGE_ERROR) from exc
