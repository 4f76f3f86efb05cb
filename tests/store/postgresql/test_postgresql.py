"""PostgreSQL specifics: HOT heartbeats and partial indexes that match the claim queries."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from devtools.polling import wait_until
from django_taskclaim.models import Task

pytestmark = [pytest.mark.django_db]


@pytest.fixture(autouse=True)
def _postgresql_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")


def set_claim_hint(kind: str) -> None:
    """Make the test session's next claim by key send the statement ``kind``."""
    from django_taskclaim.store import prepared

    with prepared.cursor(connection) as cursor:
        prepared.set_claim_hint(cursor, kind)


def claim_hint() -> str:
    """The claim statement the test session sends next (``"lean"`` before any claim)."""
    from django_taskclaim.store import prepared

    with prepared.cursor(connection) as cursor:
        return prepared.claim_hint(cursor, "lean")


def table_updates() -> tuple[int, int]:
    """The task table's committed updates and HOT updates so far (this session's flushed first)."""
    with connection.cursor() as cursor:
        # PostgreSQL 15+ reports a session's counts at most once a second; this makes the next
        # report (when the statement ends) immediate, so the read after it sees them.
        if connection.pg_version >= 150000:  # type: ignore[attr-defined]
            cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = %s::regclass",
            ["django_taskclaim_task"],
        )
        updated, hot = cursor.fetchone()
    return int(updated), int(hot)


@pytest.mark.django_db(transaction=True)
def test_heartbeats_are_hot_updates() -> None:
    """A heartbeat changes no indexed column, so PostgreSQL updates the row in place (HOT).

    Each heartbeat commits, as a worker's does, so that the row's old versions can be pruned
    from its page: inside one transaction twenty versions can outgrow a page that earlier tests
    left nearly full, and then an update moves the row whatever it changes.
    """
    claim = Task.objects.claim("job").claim
    before = table_updates()
    for _ in range(20):
        claim.heartbeat()
    # Before PostgreSQL 15 the counts arrive within a second or so.
    after = wait_until(lambda: (now := table_updates())[0] - before[0] >= 20 and now, timeout=10,
                       what="the heartbeats in the table's statistics")
    updated, hot = after[0] - before[0], after[1] - before[1]
    assert updated >= 20 and hot == updated, (updated, hot)


def plan_of(call) -> str:  # type: ignore[no-untyped-def]
    with CaptureQueriesContext(connection) as ctx:
        call()
    sql = ctx.captured_queries[-1]["sql"]
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql)
        return "\n".join(row[0] for row in cursor.fetchall())


def test_claim_next_uses_the_partial_indexes() -> None:
    for i in range(3):
        Task.objects.ensure(f"t{i}", queue="default")
    plan = plan_of(lambda: Task.objects.claim_next())
    assert "taskclaim_task_queued_idx" in plan and "taskclaim_task_running_idx" in plan, plan


def rows_read(plan: dict, table: str) -> int:  # type: ignore[type-arg]
    """Rows the scans of ``table`` in an ``EXPLAIN (ANALYZE, FORMAT JSON)`` plan read (kept or filtered out)."""
    own = 0
    if plan.get("Relation Name") == table:
        own = (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)) * plan.get("Actual Loops", 1)
    return own + sum(rows_read(child, table) for child in plan.get("Plans", ()))


def backlog(count: int, queues: int) -> None:
    """``count`` pending tasks spread over ``queues`` queues (``q0``…) and five priorities."""
    with connection.cursor() as cursor:
        cursor.execute(
            'INSERT INTO django_taskclaim_task (tenant, "key", status, owner, fencing_token, attempts, max_attempts, '
            "payload_fingerprint, result_ref, error, created_at, updated_at, queue, priority, task_path) "
            "SELECT '', 'b' || g, 'pending', '', 0, 0, 5, '', '', '', now(), now(), 'q' || (g %% %s), "
            "((g / %s) %% 5) * 10, '' FROM generate_series(1, %s) g",
            [queues, queues, count],
        )
        cursor.execute("ANALYZE django_taskclaim_task")


@pytest.mark.parametrize("queues", [1, 8])
def test_a_queue_claim_reads_each_queues_first_tasks_whatever_the_backlog(queues: int) -> None:
    """claim_next over several queues reads each queue's first tasks from the queued index (a
    nested loop over the queue names), not every waiting task of those queues and a sort: the
    claim's cost stays that of one queue's whatever the backlog. Before, a claim over 8 queues
    with 100,000 tasks waiting took ~85 ms against ~1 ms for one queue (docs/profile.md)."""
    import json

    backlog(3000, 8)
    names = [f"q{i}" for i in range(queues)]
    with CaptureQueriesContext(connection) as ctx:
        claims = Task.objects.claim_next(owner="w", queue=names, limit=2)
    assert [c.as_task().priority for c in claims] == [40, 40]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + ctx.captured_queries[-1]["sql"])
        [[plan]] = cursor.fetchone()
        plan = plan if isinstance(plan, dict) else json.loads(plan)[0]  # type: ignore[unreachable]
    text = json.dumps(plan)
    assert "taskclaim_task_queued_idx" in text, text
    # Each queue's first 2 (2 claimed, and the rows the first claim left behind as dead index entries).
    assert rows_read(plan["Plan"], "django_taskclaim_task") <= 4 * queues + 10, text


def test_a_claim_over_several_queues_takes_the_highest_priority_first_then_the_oldest() -> None:
    Task.objects.ensure("a-low", queue="a", priority=-1)
    Task.objects.ensure("b-high-1", queue="b", priority=5)
    Task.objects.ensure("a-high", queue="a", priority=5)
    Task.objects.ensure("c-mid", queue="c")
    Task.objects.ensure("b-high-2", queue="b", priority=5)
    Task.objects.ensure("d-top", queue="d", priority=99)  # not asked for
    assert [c.key for c in Task.objects.claim_next(queue=["a", "b", "c"], limit=3)] == ["b-high-1", "a-high",
                                                                                       "b-high-2"]
    assert [c.key for c in Task.objects.claim_next(queue=["a", "b", "c"], limit=5)] == ["c-mid", "a-low"]


def test_reclaim_uses_the_running_index() -> None:
    plan = plan_of(lambda: Task.objects.reclaim_expired())
    assert "taskclaim_task_running_idx" in plan, plan


def test_by_key_claim_uses_the_unique_index() -> None:
    Task.objects.ensure("job")
    plan = plan_of(lambda: Task.objects.claim("job"))
    assert "Conflict Arbiter Indexes: taskclaim_task_tenant_key_uniq" in plan, plan


def synchronous_commit() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return str(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_the_lock_wait_limit_of_a_heartbeat_is_transaction_local() -> None:
    """Issue 25.8: keepalive inside a transaction limited its lock waits with a session-level
    setting, which behind PgBouncer in transaction mode reached other clients' statements."""
    from django.db import transaction

    from django_taskclaim.store import get_store

    def lock_timeout() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SHOW lock_timeout")
            return str(cursor.fetchone()[0])

    with transaction.atomic(), connection.cursor() as cursor:
        get_store("default").limit_lock_waits(cursor, 1.0)
        assert lock_timeout() == "1s"
    assert lock_timeout() == "0"


@pytest.mark.django_db(transaction=True)
def test_duplicate_records_commit_asynchronously_without_leaking_the_setting() -> None:
    from django.db import transaction

    Task.objects.claim("job", owner="winner")
    assert not Task.objects.claim("job", owner="loser-1").claimed  # autocommit: async audit row
    assert synchronous_commit() == "on"  # set for that one statement's transaction only
    with transaction.atomic():
        assert not Task.objects.claim("job", owner="loser-2").claimed
        assert synchronous_commit() == "on"  # never inside the caller's transaction
    owners = set(Task.objects.get(key="job").attempt_set.filter(outcome="duplicate").values_list("owner", flat=True))
    assert owners == {"loser-1", "loser-2"}


@pytest.mark.django_db(transaction=True)  # inside a test's transaction, close() keeps the session
def test_the_store_cursor_is_reused_per_session_and_logged_with_its_values() -> None:
    """One driver cursor per server session, kept open across statements; Django's query log
    (CaptureQueriesContext, DEBUG) shows the prepared statements with their values."""
    from django_taskclaim.store import prepared

    with prepared.cursor(connection) as first:
        driver = first.cursor
    with prepared.cursor(connection) as second:
        assert second.cursor is driver and not driver.closed
    with CaptureQueriesContext(connection) as ctx:
        Task.objects.claim("logged-key", owner="w")
    assert "'logged-key'" in ctx.captured_queries[-1]["sql"]
    connection.close()
    with prepared.cursor(connection) as third:  # a new session: a new driver cursor
        assert third.cursor is not driver


def test_a_session_whose_time_zone_differs_gets_a_cursor_in_that_time_zone() -> None:
    """As Django's own cursors: when the connection's time zone is not the one its timestamps
    load in (a changed TIME_ZONE), the cursor loads them in the connection's."""
    import zoneinfo

    from django.db import connections

    from django_taskclaim.store import prepared

    Task.objects.claim("zoned", owner="w")
    tokyo = zoneinfo.ZoneInfo("Asia/Tokyo")
    wrapper = connections["default"]  # the wrapper itself: `connection` is a proxy to it
    wrapper.__dict__["timezone"] = tokyo  # Django's cached property, as a settings change sets it
    try:
        with prepared.cursor(wrapper) as cursor:
            prepared.execute(cursor, "SELECT lease_expires_at FROM django_taskclaim_task WHERE \"key\" = %s",
                             ["zoned"])
            (expires,) = cursor.fetchone()
        assert expires.tzinfo == tokyo
    finally:
        del wrapper.__dict__["timezone"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("audit", [True, False])
def test_every_hot_statement_fits_psycopgs_statement_cache(audit: bool) -> None:
    """psycopg converts a statement's ``%s`` text once and caches it, but only for texts up to
    ``MAX_CACHED_STATEMENT_LENGTH`` bytes and ``MAX_CACHED_STATEMENT_PARAMS`` parameters; a
    longer one is parsed again on every call (~110 µs of client CPU for the audited claim)."""
    from django.db import transaction
    from django.test.utils import override_settings
    from psycopg import _queries

    longest = getattr(_queries, "MAX_CACHED_STATEMENT_LENGTH", 4096)
    most = getattr(_queries, "MAX_CACHED_STATEMENT_PARAMS", 50)
    sent: list[tuple[str, int]] = []

    def record(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        sent.append((sql, len(params or ())))
        return execute(sql, params, many, context)

    def claim(key: str, owner: str, kind: str):  # type: ignore[no-untyped-def]
        set_claim_hint(kind)  # the insert alone, the claim statement with or without the duplicate's read
        return Task.objects.claim(key, owner=owner)

    with override_settings(TASKCLAIM_AUDIT=audit), connection.execute_wrapper(record):
        for kind in ("insert", "lean", "reading"):
            held = claim(f"new-{kind}", "a", kind).claim
            assert held is not None
            held.heartbeat()
            assert not claim(f"new-{kind}", "b", kind).claimed  # the duplicate
            held.complete({"n": 1})
            with transaction.atomic():  # the variants a caller's transaction selects
                assert claim(f"in-tx-{kind}", "a", kind).claimed
                assert not claim(f"in-tx-{kind}", "b", kind).claimed
        for i in range(4):
            Task.objects.ensure(f"q{i}", queue="default")
            Task.objects.ensure(f"q{i}", tenant="acme", queue="default")
        for tenant in (None, "acme"):
            first = Task.objects.claim_next(owner="w", tenant=tenant)[0]
            second = first.complete_and_claim_next(tenant=tenant)[0]
            second.fail(ValueError("boom"))
            Task.objects.claim_next(owner="w", tenant=tenant)[0].release()
        for i in range(4):  # a claim over several queues: each queue's first tasks, then the first of those
            Task.objects.ensure(f"s{i}", queue=f"q{i % 2}")
        for tenant in (None, ""):
            first = Task.objects.claim_next(owner="w", tenant=tenant, queue=["q0", "q1"])[0]
            first.complete_and_claim_next(tenant=tenant, queue=["q0", "q1"])[0].release()
        for i in range(6):  # a worker's batch: reserving claims, starts carried by the ending before, or alone
            Task.objects.ensure(f"r{i}", queue="default")
        a, b, c = Task.objects.claim_next(owner="w", limit=3, reserve=True)
        a.then_start(b)
        a.complete("done")
        c.start()
        b.then_start(None)
        nxt = b.complete_and_claim_next(limit=2, reserve=True)
        nxt[0].then_start(nxt[1])
        nxt[0].fail(ValueError("boom"), retry=True)
    assert len(sent) >= 20
    too_long = [(len(sql.encode()), n, sql[:60]) for sql, n in sent if len(sql.encode()) > longest or n > most]
    assert not too_long, too_long


def test_the_store_cursor_loads_timestamps_as_djangos_cursor_does() -> None:
    """The store cursor's faster timestamptz loader gives the very values Django's gives: the
    same instant, the same tzinfo (the connection's zone), for values with microseconds."""
    from django_taskclaim.store import prepared

    Task.objects.claim("stamped", owner="w", lease=12.345678)
    sql = ("SELECT lease_expires_at, created_at, updated_at, '2001-02-03 04:05:06.789012+05:30'::timestamptz "
           "FROM django_taskclaim_task WHERE \"key\" = %s")
    with connection.cursor() as cursor:
        cursor.execute(sql, ["stamped"])
        djangos = cursor.fetchone()
    with prepared.cursor(connection) as cursor:
        assert cursor.cursor.adapters.get_loader(prepared._timestamptz_oid(), 0).__name__ == "FastTzLoader"
        prepared.execute(cursor, sql, ["stamped"])
        ours = cursor.fetchone()
    assert ours == djangos
    assert [v.tzinfo for v in ours] == [v.tzinfo for v in djangos] == [connection.timezone] * 4
    assert ours[3].microsecond == 789012


@pytest.mark.parametrize("zone_name", [None, "UTC", "Asia/Tokyo"])
def test_the_fast_timestamp_loader_matches_djangos_in_every_zone(zone_name: str | None) -> None:
    """As Django's loader for USE_TZ = False (zone None: naive wall-clock time of the session's
    zone) and for a database TIME_ZONE other than UTC."""
    import zoneinfo

    import psycopg
    from django.db.backends.postgresql.psycopg_any import register_tzloader

    from django_taskclaim.store import prepared

    zone = None if zone_name is None else zoneinfo.ZoneInfo(zone_name)
    session = zone_name or "Europe/Paris"  # with USE_TZ = False Django sets the session to TIME_ZONE
    params = connection.get_connection_params()
    params.pop("context", None)
    params.pop("cursor_factory", None)
    values = ["2001-02-03 04:05:06.789012+05:30", "2026-07-01 23:59:59.999999+00", "1999-12-31 12:00:00-08"]
    sql = "SELECT " + ", ".join(["%s::timestamptz"] * len(values))
    loaded = []
    with psycopg.connect(**params, options=f"-c TimeZone={session}") as raw:
        for install in (lambda cur: register_tzloader(zone, cur),
                        lambda cur: cur.adapters.register_loader("timestamptz", prepared._fast_tz_loader(zone))):
            cur = raw.cursor()
            install(cur)
            loaded.append(cur.execute(sql, values).fetchone())
    djangos, ours = loaded
    assert ours == djangos
    assert [v.tzinfo for v in ours] == [v.tzinfo for v in djangos] == [zone] * len(values)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["insert", "lean", "reading"])
def test_a_claim_gives_the_task_as_stored_whichever_statement_claimed(kind: str) -> None:
    """Each of the three claim statements gives the task as a read of the row gives it (jsonb's
    own form of the payload, the tenant, the max attempts, both time stamps), and a claim that
    inserted makes the insert alone the next statement."""
    from django_taskclaim.store.rows import TASK_COLUMNS

    set_claim_hint(kind)
    payload = {"b": [1e100, 0.5], "a": {"z": None, "é": "x"}}
    outcome = Task.objects.claim(f"fresh-{kind}", tenant="acme", owner="w", payload=payload, max_attempts=7)
    assert outcome.claim is not None
    stored = Task.objects.get(key=f"fresh-{kind}", tenant="acme")
    assert {c: getattr(outcome.task, c) for c in TASK_COLUMNS} == {c: getattr(stored, c) for c in TASK_COLUMNS}
    assert outcome.claim.payload == stored.payload
    assert outcome.claim.lease_expires_at == stored.lease_expires_at and outcome.claim.token == 1
    assert claim_hint() == "insert"  # a claim that inserted: the insert alone comes next


@pytest.mark.django_db
def test_the_store_cursor_keeps_djangos_checks_hooks_and_error_classes() -> None:
    """The store's shorter cursor wrapper (queries not logged) still refuses a statement in a
    broken transaction, runs ``execute_wrapper`` hooks, and raises Django's error classes."""
    from django.db import DatabaseError, IntegrityError, transaction
    from django.db.transaction import TransactionManagementError

    from django_taskclaim.store import prepared

    assert not connection.queries_logged
    with prepared.cursor(connection) as cursor:
        assert type(cursor).__name__ == "StoreCursorWrapper"
    seen: list[str] = []

    def record(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        assert Task.objects.claim("hooked", owner="w").claimed
    assert any("django_taskclaim_task" in sql for sql in seen)
    with pytest.raises(IntegrityError), transaction.atomic(), prepared.cursor(connection) as cursor:  # Django's class
        cursor.execute("INSERT INTO django_taskclaim_task (id) VALUES (NULL)")
    with transaction.atomic():
        with pytest.raises(DatabaseError), transaction.atomic(savepoint=False), prepared.cursor(connection) as cursor:
            cursor.execute("SELECT 1/0")  # marks the outer block for rollback
        with pytest.raises(TransactionManagementError):  # the transaction is broken
            Task.objects.claim("after-an-error", owner="w")
        transaction.set_rollback(True)
    assert not Task.objects.filter(key="after-an-error").exists()


@pytest.mark.django_db(transaction=True)
def test_the_claim_statement_follows_its_own_sessions_committed_claims() -> None:
    """What a claim by key met steers the next claim statement of its session only, and only once
    it committed: another session starts afresh, and a rolled-back claim teaches nothing."""
    from django.db import connections, transaction

    from django_taskclaim.store import prepared

    assert claim_hint() == "lean"  # a new session
    Task.objects.claim("first", owner="w")
    assert claim_hint() == "insert"
    other = connections.create_connection("default")
    try:
        with prepared.cursor(other) as cursor:
            assert prepared.claim_hint(cursor, "lean") == "lean"
    finally:
        other.close()
    with transaction.atomic():
        assert not Task.objects.claim("first", owner="second").claimed  # met a task it could not claim
        assert claim_hint() == "insert"  # not before the commit
        transaction.set_rollback(True)
    assert claim_hint() == "insert"
    with transaction.atomic():
        assert not Task.objects.claim("first", owner="second").claimed
    assert claim_hint() == "reading"


def alter_owner(length: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE django_taskclaim_task ALTER COLUMN owner TYPE varchar({length})")


@pytest.mark.django_db(transaction=True)
def test_prepared_statements_survive_a_column_type_change() -> None:
    """A migration that changes the type of a column the store's statements return makes their
    prepared plans fail ("cached plan must not change result type", SQLSTATE 0A000) on every
    session that prepared them: the store prepares them again. Outside a transaction the call
    succeeds; inside one, the error aborted the caller's transaction, and the next call after the
    rollback succeeds."""
    from django.db import NotSupportedError, transaction

    Task.objects.ensure("before", queue="default")  # queued work: claim_next hands it out
    assert Task.objects.claim_next(owner="w")
    assert Task.objects.claim("claimed-before", owner="w").claimed
    try:
        alter_owner(512)
        assert Task.objects.ensure("after", queue="default").status == "pending"
        [claim] = Task.objects.claim_next(owner="w")
        assert claim.key == "after"
        assert Task.objects.claim("claimed-after", owner="w").claimed
        alter_owner(255)  # the plans prepared meanwhile change result type again
        with pytest.raises(NotSupportedError, match="cached plan"), transaction.atomic():
            Task.objects.ensure("inside", queue="default")
        with transaction.atomic():
            assert Task.objects.ensure("inside", queue="default").status == "pending"
            assert [c.key for c in Task.objects.claim_next(owner="w")] == ["inside"]
    finally:
        alter_owner(255)



def generic_plan(sql: str, params: list) -> dict:  # type: ignore[type-arg]
    """``EXPLAIN ANALYZE`` of ``sql`` (a store statement, ``%s`` placeholders) run as the store runs
    it: prepared, with the generic plan a session keeps once PostgreSQL settles on one."""
    import json
    import re

    numbers = iter(range(1, len(params) + 1))
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute("PREPARE taskclaim_test AS " + re.sub(r"%[sb]", lambda _: f"${next(numbers)}", sql))
        try:
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE taskclaim_test ("
                           + ", ".join(["%s"] * len(params)) + ")", params)
            [[plan]] = cursor.fetchone()
        finally:
            cursor.execute("DEALLOCATE taskclaim_test")
    return plan if isinstance(plan, dict) else json.loads(plan)[0]  # type: ignore[no-any-return]


@pytest.mark.parametrize("reserve", [False, True])
def test_a_completion_that_claims_reads_only_the_task_rows_it_claims(reserve: bool, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The queue claim of ``complete_and_claim_next`` updates the rows it picked by their ids (the
    primary key), and a reserving one finds the task to start among the rows picked: in the plan a
    worker's session keeps (generic, prepared), it reads no task row beyond those. Before, the
    update joined the picked ids against the whole task table (a hash join over a sequential scan:
    every row, each batch) and the reserving form scanned it once more to find the first task to
    run; the batch-16 worker drained 10–25% slower for it."""
    import json

    from django.db import transaction

    from django_taskclaim.store.postgresql import store

    backlog(3000, 1)
    claim = Task.objects.claim_next(owner="w", queue="q0")[0]
    sent: list[tuple[str, list]] = []  # type: ignore[type-arg]
    execute = store.execute
    monkeypatch.setattr(store, "execute", lambda cursor, sql, params: (sent.append((sql, list(params))),
                                                                       execute(cursor, sql, params)))
    with transaction.atomic():  # run once to capture the statement, then undone and explained
        more = claim.complete_and_claim_next(limit=16, queue="q0", reserve=reserve)
        assert len(more) == 16 and [c.reserved for c in more].count(False) == (1 if reserve else 16)
        transaction.set_rollback(True)
    plan = generic_plan(*sent[-1])
    # The completed task, the 16 picked (each read again by the update), dead index entries: not 3,000.
    assert rows_read(plan["Plan"], "django_taskclaim_task") <= 100, json.dumps(plan)
