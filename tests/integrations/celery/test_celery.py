"""The Celery bridge against real parts: ``celery worker`` processes (prefork, 2 children), a
real broker (``redis-server`` or ``rabbitmq-server``) and a ``redis-server`` result backend,
all on free ports and started here; the test database shared with them.

"Ran once" is proved by counting ``Effect`` rows, which the task body writes under its fence.

Every test runs once per broker in ``BROKERS``: Redis on both databases, RabbitMQ on PostgreSQL
(the production pair; the bridge's broker-dependent paths are the same on SQLite), or the
brokers named in ``TASKCLAIM_TEST_BROKERS`` (``redis,rabbitmq``). A test that only means
something on one broker (visibility timeout, consumer timeout, quorum queues) is marked
``only_on(kind)``: it runs on that broker only, and is not collected where ``BROKERS`` leaves
that broker out (a deliberate split, not a missing server: no skip is reported).
"""

from __future__ import annotations

import io
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import transaction
from django.test import override_settings

from devtools.polling import wait_until
from devtools.processes import Child, Supervisor, send
from django_taskclaim.models import Attempt, Task
from tests.conftest import expire, requirement_missing
from tests.testapp.models import Effect

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

try:
    import kombu
    import redis

    from tests.programs import celery_app as celery_app_module
except ImportError as exc:  # in CI a missing Celery is a failure, not a skip
    if os.environ.get("CI"):
        raise
    pytest.skip(f"{exc.name} is not installed (pip install -e '.[dev]')", allow_module_level=True)

app = celery_app_module.app
work = celery_app_module.work
point_at = celery_app_module.point_at
import tests.programs.celery_tasks  # noqa: E402, F401  (its shared tasks register with every app, this one too)

# The shared task as registered with the app the tests point at their servers. The module's name
# ``always_fails`` is a proxy to the task of Celery's *current* app, which any other app created
# with ``set_as_current`` (the default) replaces for the rest of the process.
always_fails = app.tasks["tests.programs.celery_tasks.always_fails"]

QUEUE = "celery"  # the default queue (a Redis list, a RabbitMQ queue, of that name)
# Every queue a test uses: emptied before each test.
QUEUES = (QUEUE, "a", "b", "later", "poison-1", "poison-1-dead", "poison-5", "poison-5-dead")
BROKERS = [b for b in os.environ.get(
    "TASKCLAIM_TEST_BROKERS",
    "redis,rabbitmq" if settings.DATABASES["default"]["ENGINE"].endswith("postgresql") else "redis",
).split(",") if b]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    return wait_until(predicate, timeout=timeout, what=what)


def start_server(kind: str, **options: Any) -> Any:
    """A started Redis or RabbitMQ server; a missing binary skips locally, fails in CI."""
    from devtools.servers import RabbitMQServer, RedisServer

    try:
        server = RedisServer() if kind == "redis" else RabbitMQServer(**options)
    except RuntimeError:
        requirement_missing("redis-server" if kind == "redis" else "rabbitmq-server")
    return server.start()


@pytest.fixture(scope="module")
def redis_server() -> Iterator[Any]:
    """The result backend (database 1), and the broker (database 0) of the Redis runs."""
    server = start_server("redis")
    try:
        yield server
    finally:
        server.stop()


class Broker:
    """What the tests need of a broker: its URL, queue lengths, losing and clearing messages."""

    def __init__(self, kind: str, server: Any, results: Any) -> None:
        self.kind, self.server, self.url = kind, server, server.url
        self.results = redis.Redis.from_url(results.url.rsplit("/", 1)[0] + "/1")

    def length(self, queue: str = QUEUE) -> int:
        """Messages ready in ``queue`` (not counting those a worker holds unacknowledged)."""
        if self.kind == "redis":
            with redis.Redis.from_url(self.url) as client:
                return int(client.llen(queue))
        with kombu.Connection(self.url) as conn:
            try:
                return int(conn.channel().queue_declare(queue=queue, passive=True).message_count)
            except conn.channel_errors:  # NOT_FOUND: never declared, so empty
                return 0

    def length_reaches(self, n: int, queue: str = QUEUE) -> int:
        """``length()`` once it is ``n`` (``TimeoutError`` after 10 s): a message just published
        reaches RabbitMQ's count a moment later (the producer does not wait for the broker's confirm)."""
        wait_until(lambda: self.length(queue) == n, timeout=10, what=f"{n} message(s) ready in {queue}")
        return self.length(queue)

    def lose(self, queue: str = QUEUE) -> None:
        """Broker data loss: every message ready in ``queue`` is gone."""
        if self.kind == "redis":
            with redis.Redis.from_url(self.url) as client:
                client.delete(queue)
        else:
            with kombu.Connection(self.url) as conn:
                conn.channel().queue_purge(queue)

    def restart(self) -> None:
        """Stop the broker and start it again on the same port (RabbitMQ keeps its data, this
        Redis keeps nothing)."""
        self.server.restart()

    def clear(self) -> None:
        self.results.flushdb()
        if self.kind == "redis":
            with redis.Redis.from_url(self.url) as client:
                client.flushdb()
            return
        # Purged, not deleted: the app's producer remembers which queues it declared, and
        # would publish into a deleted one (dropped by RabbitMQ) without declaring it again.
        with kombu.Connection(self.url) as conn:
            for queue in QUEUES:
                channel = conn.channel()
                try:
                    channel.queue_purge(queue)
                except conn.channel_errors:
                    pass
                finally:
                    channel.close()


@pytest.fixture(scope="module", params=BROKERS)
def broker_server(request: pytest.FixtureRequest, redis_server: Any) -> Iterator[Broker]:
    """The module's broker; the in-process app publishes to it and reads results from Redis."""
    kind = request.param
    server = redis_server if kind == "redis" else start_server(kind)
    backend = redis_server.url.rsplit("/", 1)[0] + "/1"
    previous = (app.conf.broker_url, app.conf.result_backend)
    point_at(server.url, backend)
    try:
        yield Broker(kind, server, redis_server)
    finally:
        point_at(*previous)
        if server is not redis_server:
            server.stop()


@pytest.fixture
def broker(broker_server: Broker) -> Iterator[Broker]:
    """The module's broker with its queues and the result backend emptied before each test."""
    broker_server.clear()
    yield broker_server


def only_on(kind: str) -> Callable[[Callable[..., None]], Callable[..., None] | None]:
    """Run a test on the broker ``kind`` only (overrides the module's broker parameter)."""

    def decorate(test: Callable[..., None]) -> Callable[..., None] | None:
        if kind not in BROKERS:
            return None  # the module name is bound to None: pytest collects nothing for it
        return pytest.mark.parametrize("broker_server", [kind], indirect=True)(test)

    return decorate


def owns(worker: Child, pid: int) -> bool:
    """Whether ``pid`` is ``worker`` or one of its pool processes (its process group)."""
    try:
        return os.getpgid(pid) == worker.pid  # started in a session of its own: its pid is the group id
    except ProcessLookupError:
        return False


@pytest.fixture
def workers(broker: Broker, redis_server: Any, processes: Supervisor, tmp_path: Path) -> Any:
    """Start ``celery worker`` processes (prefork, concurrency 2); all are killed at the end."""

    def start(name: str, queues: str = QUEUE, broker_url: str | None = None, **env: str) -> Child:
        return processes.start(
            "celery", "-A", "tests.programs.celery_app", "worker", "-P", "prefork", "-c", "2",
            "-n", f"{name}@%h", "-Q", queues, "-l", "INFO", "--without-gossip", "--without-mingle",
            "--without-heartbeat",
            env={"TASKCLAIM_TEST_REDIS_URL": redis_server.url,
                 "TASKCLAIM_TEST_BROKER_URL": broker_url or broker.url, **env},
            group=True, stderr=tmp_path / f"{name}.log",  # the worker and its pool: signals go to all
        )

    def ready(*ws: Child) -> None:
        for w in ws:
            wait_for(lambda w=w: "ready." in w.stderr() or not w.alive(), 60, "the worker to start")
            assert w.alive(), w.stderr()

    start.ready = ready  # type: ignore[attr-defined]
    return start


def effects(key: str) -> list[Effect]:
    return list(Effect.objects.filter(task_key=key).order_by("id"))


def attempts(key: str) -> list[Attempt]:
    return list(Attempt.objects.filter(task__key=key).order_by("id"))


def running_owner_pid(key: str) -> int:
    """The pid of the worker child holding ``key``, from its owner ``host:pid:random``."""
    owner = wait_for(lambda: Task.objects.filter(key=key, status="running").values_list("owner", flat=True).first(),
                     30, f"{key} to be claimed")
    return int(owner.split(":")[-2])


def test_same_task_sent_twice_at_once_runs_once(workers: Any) -> None:
    w = workers("w1")
    workers.ready(w)
    first, second = work.apply_async(("dup", 1.0)), work.apply_async(("dup", 1.0))
    one, two = first.get(timeout=30), second.get(timeout=30)

    assert one == two  # both callers get the result of the one execution
    assert len(effects("work-dup")) == 1
    rows = attempts("work-dup")
    executed = [a for a in rows if a.token is not None]
    assert [(a.token, a.outcome) for a in executed] == [(1, "succeeded")]
    assert executed[0].delivery_id in {first.id, second.id}  # the Celery task id is recorded
    duplicates = [a for a in rows if a.outcome == "duplicate"]
    assert duplicates and {a.delivery_id for a in duplicates} <= {first.id, second.id}
    assert Task.objects.get(key="work-dup").result == one


@only_on("redis")  # RabbitMQ has no visibility timeout: see the consumer_timeout test
def test_visibility_timeout_redelivery_does_the_work_once(workers: Any, broker: Broker) -> None:
    w = workers("w1", TASKCLAIM_TEST_VISIBILITY_TIMEOUT="2")
    workers.ready(w)
    result = celery_app_module.hold.apply_async(("vt",))
    # The task runs until the broker has handed the same message out again (no fixed wait).
    wait_for(lambda: Attempt.objects.filter(task__key="hold-vt", outcome="duplicate",
                                            delivery_id=result.id).exists(), 60, "the redelivery")
    Effect.objects.create(task_key="release:hold-vt", token=0, worker="test")
    value = result.get(timeout=40)

    assert value["token"] == 1
    assert len(effects("hold-vt")) == 1
    rows = attempts("hold-vt")
    assert [(a.token, a.outcome) for a in rows if a.token is not None] == [(1, "succeeded")]
    assert all(a.delivery_id == result.id for a in rows)


def test_worker_child_killed_mid_task_is_redelivered_and_completes_once(workers: Any) -> None:
    w = workers("w1")
    workers.ready(w)
    result = work.apply_async(("kill", 3.0))
    pid = running_owner_pid("work-kill")
    assert owns(w, pid)
    send(pid, signal.SIGKILL)  # the worker child running the body

    value = result.get(timeout=40)
    assert value["token"] >= 2 and value["pid"] != pid
    assert [e.token for e in effects("work-kill")] == [value["token"]]
    executed = [(a.token, a.outcome) for a in attempts("work-kill") if a.token is not None]
    assert executed[0] == (1, "taken_over")
    assert executed[-1] == (value["token"], "succeeded")
    assert all(a.delivery_id == result.id for a in attempts("work-kill"))


def test_killed_worker_message_comes_back_and_completes_once(workers: Any, broker: Broker) -> None:
    """SIGKILL of the whole worker (main process and children) mid-task: no one acknowledges
    or rejects the message. RabbitMQ requeues it as the connection drops; Redis keeps it in its
    unacknowledged set until a consumer restores it after the visibility timeout (here the
    second worker's, 3 s). The redelivery waits out the dead worker's lease, then takes over."""
    a = workers("wa")
    workers.ready(a)
    result = work.apply_async(("killw", 3.0))
    pid = running_owner_pid("work-killw")
    assert owns(a, pid)
    a.kill()
    a.wait(10)

    b = workers("wb", TASKCLAIM_TEST_VISIBILITY_TIMEOUT="3")
    workers.ready(b)
    value = result.get(timeout=60)
    assert value["token"] == 2 and owns(b, value["pid"])
    assert [e.token for e in effects("work-killw")] == [2]
    executed = [(a.token, a.outcome) for a in attempts("work-killw") if a.token is not None]
    assert executed == [(1, "taken_over"), (2, "succeeded")]
    assert all(a.delivery_id == result.id for a in attempts("work-killw"))


def test_broker_restart_loses_nothing(workers: Any, broker: Broker) -> None:
    """The broker restarts while one task runs and another waits in a queue. RabbitMQ keeps the
    queued message (durable queue, persistent message) and requeues the running one's; this
    Redis (no persistence) loses both, and ``reclaim --requeue`` sends the queued one again.
    Either way each body runs once and each caller gets its result."""
    from django_taskclaim.celery import enqueue_once

    hold = celery_app_module.hold
    w = workers("w1")
    workers.ready(w)
    running = enqueue_once(hold, key="hold-br", args=("br",))
    queued = enqueue_once(work, key="work-br", args=("br",), queue="later")  # no worker reads "later" yet
    assert running.sent and queued.sent
    pid = running_owner_pid("hold-br")
    wait_for(lambda: broker.length("later") == 1, 10, "the queued message")

    broker.restart()
    assert broker.length("later") == (1 if broker.kind == "rabbitmq" else 0)
    Task.objects.filter(key="work-br").update(updated_at="2000-01-01T00:00:00Z")  # sent long ago
    out = io.StringIO()
    with override_settings(TASKCLAIM_CELERY_APP="tests.programs.celery_app.app"):
        call_command("taskclaim_reclaim", "--requeue", stdout=out)
    assert "requeue: 1 lost message(s) re-sent" in out.getvalue(), out.getvalue()

    Effect.objects.create(task_key="release:hold-br", token=0, worker="test")
    later = workers("w2", queues="later")
    workers.ready(later)
    assert running.result(app=app).get(timeout=60) == {"name": "br", "token": 1, "pid": pid}
    assert queued.result(app=app).get(timeout=60)["token"] == 1
    assert [e.token for e in effects("hold-br")] == [1] and [e.token for e in effects("work-br")] == [1]
    for key in ("hold-br", "work-br"):
        executed = [(a.token, a.outcome) for a in attempts(key) if a.token is not None]
        assert executed == [(1, "succeeded")], key


def test_paused_worker_is_fenced_off_when_it_resumes(workers: Any) -> None:
    a, b = workers("wa", queues="a"), workers("wb", queues="b")
    workers.ready(a, b)
    first = work.apply_async(("pause", 1.5), queue="a")
    pid = running_owner_pid("work-pause")
    assert owns(a, pid)
    a.stop()  # the whole worker freezes (a paused VM, a long GC)
    try:
        wait_for(lambda: Task.objects.expired().filter(key="work-pause").exists(), 20, "the lease to expire")
        second = work.apply_async(("pause", 1.5), queue="b")
        taken = second.get(timeout=30)
        assert taken["token"] == 2 and owns(b, taken["pid"])
    finally:
        a.cont()

    # The first delivery resumes: its fenced write and completion are refused, and it reports
    # the stored result of the worker that took over.
    assert first.get(timeout=30) == taken
    assert [e.token for e in effects("work-pause")] == [2]
    task = Task.objects.get(key="work-pause")
    assert (task.status, task.fencing_token, task.result) == ("succeeded", 2, taken)
    old = Attempt.objects.get(task=task, token=1)
    assert old.outcome == "taken_over" and old.stale_writes >= 1
    refused = set(wait_for(lambda: list(Effect.objects.filter(task_key="refused:work-pause")
                                        .values_list("worker", flat=True)), 10, "the refusals"))
    assert "fenced write" in refused, refused


def test_enqueue_once_publishes_on_commit_only_once(workers: Any, broker: Broker) -> None:
    from django_taskclaim.celery import enqueue_once

    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        enqueue_once(work, key="work-once", args=("once",))
        raise Abort
    assert broker.length() == 0
    assert not Task.objects.filter(key="work-once").exists()

    with transaction.atomic():
        handles = [enqueue_once(work, key="work-once", args=("once",)) for _ in range(3)]
        assert broker.length() == 0  # nothing goes out before the commit
    assert [h.created for h in handles] == [True, False, False]
    assert handles[0].sent and not handles[1].sent
    assert handles[1].status == "pending" and handles[1].celery_id == handles[0].celery_id
    again = enqueue_once(work, key="work-once", args=("once",))
    assert not again.created
    assert broker.length_reaches(1) == 1

    w = workers("w1")
    workers.ready(w)
    value = handles[0].result(app=app).get(timeout=30)
    assert value["name"] == "once"
    assert len(effects("work-once")) == 1
    assert [a.delivery_id for a in attempts("work-once")] == [handles[0].celery_id]
    done = enqueue_once(work, key="work-once", args=("once",))
    assert (done.created, done.status) == (False, "succeeded")
    assert broker.length() == 0


def test_always_failing_task_stops_at_max_attempts(workers: Any) -> None:
    w = workers("w1")
    workers.ready(w)
    result = always_fails.apply_async(("poison",))  # autoretry_for, max_retries=None: Celery never gives up
    wait_for(lambda: Task.objects.filter(key="poison", status="failed").exists(), 30, "the task to fail")
    result.get(timeout=20, propagate=False)
    assert result.state == "FAILURE"

    task = Task.objects.get(key="poison")
    assert task.attempts == 3 and "Boom" in task.error
    assert len(effects("poison")) == 3
    assert [a.outcome for a in attempts("poison")] == ["retry", "retry", "failed"]

    # A later delivery of the same work is refused without running it.
    again = always_fails.apply_async(("poison",))
    again.get(timeout=20, propagate=False)
    assert again.state == "FAILURE" and "TaskFailed" in (again.traceback or "")
    assert len(effects("poison")) == 3


@only_on("redis")
def test_a_retried_tasks_durable_steps_are_not_called_again(workers: Any) -> None:
    w = workers("w1")
    workers.ready(w)
    stepped = app.tasks["tests.programs.celery_tasks.stepped"]
    assert stepped.apply_async(("stepped",)).get(timeout=30) == ["first", "second"]
    task = Task.objects.get(key="stepped")
    assert (task.status, task.attempts) == ("succeeded", 2)
    assert [(e.task_key, e.token) for e in Effect.objects.filter(task_key__startswith="stepped:").order_by("id")] == [
        ("stepped:first", 1), ("stepped:second", 2)]


def test_reclaim_requeue_resends_lost_messages_and_they_complete_once(workers: Any, broker: Broker) -> None:
    from django_taskclaim.celery import enqueue_once

    lost = enqueue_once(work, key="work-lost", args=("lost",))
    crashed = enqueue_once(work, key="work-crashed", args=("crashed",))
    assert lost.sent and crashed.sent
    assert broker.length_reaches(2) == 2  # both arrived: none can land after the loss below
    broker.lose()  # broker data loss: both messages are gone
    # An acks-early worker took "crashed" and died: its message is gone, its lease runs out.
    assert Task.objects.claim("work-crashed", owner="dead-worker", lease=30).claimed
    expire(Task.objects.get(key="work-crashed"))
    Task.objects.filter(key="work-lost").update(updated_at="2000-01-01T00:00:00Z")  # sent long ago

    out = io.StringIO()
    with override_settings(TASKCLAIM_CELERY_APP="tests.programs.celery_app.app"):
        call_command("taskclaim_reclaim", "--requeue", stdout=out)
        assert "requeue: 2 lost message(s) re-sent" in out.getvalue(), out.getvalue()
        assert broker.length_reaches(2) == 2
        out = io.StringIO()
        call_command("taskclaim_reclaim", "--requeue", stdout=out)  # just re-sent: not lost
        assert "requeue: 0 lost message(s) re-sent" in out.getvalue(), out.getvalue()

    w = workers("w1")
    workers.ready(w)
    assert lost.result(app=app).get(timeout=30)["name"] == "lost"
    assert crashed.result(app=app).get(timeout=30)["name"] == "crashed"
    assert len(effects("work-lost")) == 1 and len(effects("work-crashed")) == 1
    assert Task.objects.get(key="work-lost").dispatch["sent"] == 2


@pytest.fixture(scope="module")
def short_consumer_timeout() -> Iterator[Any]:
    """A RabbitMQ server whose consumer_timeout is 2 s, checked every second."""
    server = start_server("rabbitmq", config={"consumer_timeout": "2000"})
    try:
        yield server
    finally:
        server.stop()


@only_on("rabbitmq")  # Redis has the visibility timeout instead
@pytest.mark.parametrize("on_busy", ["retry", "skip", "wait"])
def test_task_outliving_the_consumer_timeout_runs_once(broker: Broker, workers: Any, on_busy: str,
                                                       request: pytest.FixtureRequest) -> None:
    """RabbitMQ closes the channel of a delivery left unacknowledged past ``consumer_timeout``
    and hands the message to another consumer while the first delivery still runs.

    Celery treats the closed channel as unrecoverable: that worker stops taking messages,
    finishes its running task (warm shutdown) and exits; a supervisor would restart it. The
    redelivery reaches the other worker and finds the task RUNNING under a live lease:
    ``retry`` re-publishes it every ``busy_countdown`` until the first delivery completed, then
    returns the stored result; ``skip`` drops it; ``wait`` blocks the slot with the redelivery
    unacknowledged, so a wait longer than the timeout stops that worker too and the message
    goes to a third. In every case the body ran once and the caller gets the first result.
    """
    server = request.getfixturevalue("short_consumer_timeout")
    task = {"retry": celery_app_module.hold, "skip": celery_app_module.hold_skip,
            "wait": celery_app_module.hold_wait}[on_busy]
    key = {"retry": "hold-ct", "skip": "hold-skip-ct", "wait": "hold-wait-ct"}[on_busy]
    timed_out = "delivery acknowledgement on channel"
    backend = app.conf.result_backend
    point_at(server.url, backend)
    try:
        w1, w2 = workers("w1", broker_url=server.url), workers("w2", broker_url=server.url)
        workers.ready(w1, w2)
        result = task.apply_async(("ct",))
        pid = running_owner_pid(key)
        first, other = (w1, w2) if owns(w1, pid) else (w2, w1)
        assert owns(first, pid)
        # The redelivery found the task running: a duplicate attempt of the same Celery task id.
        wait_for(lambda: Attempt.objects.filter(task__key=key, outcome="duplicate",
                                                delivery_id=result.id).exists(), 60, "the redelivery")
        assert timed_out in first.stderr()  # the consumer timeout fired
        if on_busy == "wait":
            wait_for(lambda: timed_out in other.stderr(), 60, "the waiting delivery to time out as well")
            third = workers("w3", broker_url=server.url)
            workers.ready(third)
        Effect.objects.create(task_key=f"release:{key}", token=0, worker="test")

        value = result.get(timeout=60)
        assert value["token"] == 1 and value["pid"] == pid  # the first delivery's completion landed
        assert [e.token for e in effects(key)] == [1]
        executed = [(a.token, a.outcome) for a in attempts(key) if a.token is not None]
        assert executed == [(1, "succeeded")]
        assert all(a.delivery_id == result.id for a in attempts(key))
        assert Task.objects.get(key=key).result == value
        first.wait(30)  # Celery's reaction to the closed channel: the worker exits
        if on_busy == "wait":
            other.wait(30)
            # The third worker got the message last: it found the stored result.
            wait_for(lambda: len(attempts(key)) >= 3, 30, "the third delivery")
        else:
            assert other.alive() and timed_out not in other.stderr(), other.stderr()
    finally:
        point_at(broker.url, backend)


@only_on("rabbitmq")
@pytest.mark.parametrize("delivery_limit", [1, 5])
def test_quorum_delivery_limit_or_max_attempts_ends_a_poison_message(
        workers: Any, broker: Broker, delivery_limit: int) -> None:
    """A message that kills its worker child every time, on a quorum queue. RabbitMQ counts
    the returns of the message (``x-delivery-limit``), the database counts the claims
    (``max_attempts=3``); ``on_busy="wait"`` makes every redelivery wait out the dead
    child's lease and claim the task itself, so both count the same executions. The lower
    one ends it: a delivery limit of 1 dead-letters the message after two executions, the
    task left unfinished; with 5, the third claim is the last and the task ends FAILED."""
    from kombu import Connection

    queue = f"poison-{delivery_limit}"
    dead = f"{queue}-dead"
    with Connection(broker.url) as conn:  # the dead-letter queue, where a test can count
        conn.channel().queue_declare(dead, durable=True, auto_delete=False)
    w = workers("w1", queues=queue, TASKCLAIM_TEST_QUORUM_QUEUE=f"{queue}:{delivery_limit}")
    workers.ready(w)
    task = celery_app_module.kills_its_worker
    result = task.apply_async(("q",), queue=celery_app_module.quorum_queue(queue, delivery_limit))

    if delivery_limit == 1:
        wait_for(lambda: broker.length(dead) == 1, 60, "RabbitMQ to dead-letter the message")
        row = Task.objects.get(key="poison-q")
        assert row.status == "running" and row.attempts == 2  # unfinished: reclaim's to repair
    else:
        wait_for(lambda: Task.objects.filter(key="poison-q", status="failed").exists(), 60,
                 "max_attempts to end the task")
        result.get(timeout=30, propagate=False)
        assert result.state == "FAILURE" and "TaskFailed" in (result.traceback or "")
        assert broker.length(dead) == 0 and broker.length(queue) == 0
        assert Task.objects.get(key="poison-q").attempts == 3
    assert len(effects("poison-q")) == min(delivery_limit + 1, 3)
