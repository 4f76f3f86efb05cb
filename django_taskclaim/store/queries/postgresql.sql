-- PostgreSQL: only the statements whose SQL differs from common.sql, and its own.

-- name: lock
-- A row lock, not a write: NO KEY UPDATE does not block the attempt table's foreign key checks.
SELECT 1 FROM django_taskclaim_task
WHERE id = %s AND status = 'running' AND fencing_token = %s
FOR NO KEY UPDATE

-- name: row_free
-- SKIP LOCKED answers "does a transaction hold the row?" without waiting for it.
SELECT fencing_token FROM django_taskclaim_task WHERE id = %s
FOR NO KEY UPDATE SKIP LOCKED

-- name: adopt_payload
UPDATE django_taskclaim_task SET payload = %s::jsonb, payload_fingerprint = %s
WHERE id = %s AND payload_fingerprint = ''

-- name: estimated_rows
-- The rows of a table (its name) as ANALYZE and autovacuum last counted them: -1 (or NULL) before
-- the first count.
SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)

-- name: limit_lock_waits
-- Transaction-local (is_local = true): behind PgBouncer in transaction mode, or in Django's
-- pool, a session-level setting would outlive us on another client's session. ('1500ms')
SELECT set_config('lock_timeout', %s, true)

-- name: reset
-- Failed or cancelled tasks (an array of ids) pending again, as never run.
UPDATE django_taskclaim_task
SET status = 'pending', attempts = 0, owner = '', error = '', lease_expires_at = NULL,
    updated_at = statement_timestamp()
WHERE id = ANY(%s::bigint[]) AND status IN ('failed', 'cancelled')

-- name: held
-- Of the tasks (the same array of ids, twice), those whose row a transaction holds: the rows this
-- statement sees that SKIP LOCKED passes over. FOR SHARE conflicts with the owner's FOR NO KEY
-- UPDATE (fenced()) and with updates, not with a duplicate's FOR KEY SHARE.
SELECT id FROM django_taskclaim_task
WHERE id = ANY(%s::bigint[])
  AND id NOT IN (SELECT id FROM django_taskclaim_task WHERE id = ANY(%s::bigint[]) FOR SHARE SKIP LOCKED)
ORDER BY id

-- name: heartbeat
-- Renew the claim's lease (seconds, task id, token) from the database clock: the new expiry, no
-- row when the claim no longer holds the task. Changes no indexed column: a HOT update.
UPDATE django_taskclaim_task
SET lease_expires_at = statement_timestamp() + make_interval(secs => %s), updated_at = statement_timestamp()
WHERE id = %s AND status = 'running' AND fencing_token = %s
RETURNING lease_expires_at

-- name: heartbeat_many
-- Renew the leases of many claims at once (seconds; the ids and the tokens, two arrays of one
-- length): the ids renewed, with their new expiry. A claim missing was fenced off.
UPDATE django_taskclaim_task t
SET lease_expires_at = statement_timestamp() + make_interval(secs => %s), updated_at = statement_timestamp()
FROM unnest(%s::bigint[], %s::bigint[]) AS h(id, token)
WHERE t.id = h.id AND t.fencing_token = h.token AND t.status = 'running'
RETURNING t.id, t.lease_expires_at

-- name: task_columns
-- A part: a task row's columns in TASK_COLUMNS order, as decode() reads them (JSON as text).
id, tenant, "key", status, owner, fencing_token, attempts, max_attempts, lease_expires_at,
payload::text AS payload, payload_fingerprint, result::text AS result, result_ref, error,
dispatch::text AS dispatch, created_at, updated_at, queue, priority, run_after, task_path

-- name: task_insert
-- A part: the insert of a task's row, its columns but id named (in TASK_COLUMNS order).
INSERT INTO django_taskclaim_task (tenant, "key", status, owner, fencing_token, attempts, max_attempts,
    lease_expires_at, payload, payload_fingerprint, result, result_ref, error, dispatch, created_at,
    updated_at, queue, priority, run_after, task_path)

-- name: attempt_insert
-- A part: the insert of an attempt row, its columns named.
INSERT INTO django_taskclaim_attempt (task_id, token, owner, delivery_id, started_at, ended_at, outcome,
    stale_writes, error, error_class, traceback)

-- name: refresh_waiting
-- A coalescing group's latest task takes the newest arguments (payload, fingerprint, delay in
-- seconds, task id, task path) if it still waits: pending and never started. attempts counts the
-- starts: a claim that runs the task counts one and keeps it (a retry, an expired lease), a release
-- of a claim that never ran gives it back (a reservation, a spare, an import grace, SIGTERM), so a
-- released task still waits although its token went up. "Not before": now + delay. The row, or
-- none when a claim took the task first (re-checked on the row it locks).
UPDATE django_taskclaim_task
SET payload = %s::jsonb, payload_fingerprint = %s::text,
    run_after = statement_timestamp() + make_interval(secs => %s), updated_at = statement_timestamp()
WHERE id = %s AND status = 'pending' AND attempts = 0 AND task_path = %s
RETURNING {{task_columns}},
    clock_timestamp() AS claimed_at

-- name: refresh_waiting_capped
-- refresh_waiting with a max_delay (seconds, after the delay): "not before" now + delay, capped at
-- the group's first enqueue (created_at) + max_delay.
UPDATE django_taskclaim_task
SET payload = %s::jsonb, payload_fingerprint = %s::text,
    run_after = LEAST(statement_timestamp() + make_interval(secs => %s), created_at + make_interval(secs => %s)),
    updated_at = statement_timestamp()
WHERE id = %s AND status = 'pending' AND attempts = 0 AND task_path = %s
RETURNING {{task_columns}},
    clock_timestamp() AS claimed_at

-- name: insert_waiting
-- A coalesced task, pending (tenant, key: 128 random bits, max_attempts, payload, fingerprint,
-- dispatch, queue, priority, delay in seconds, task path): "not before" now + delay. Its row.
{{task_insert}}
VALUES (%s::text, %s::text, 'pending', '', 0, 0, %s::integer, NULL, %s::jsonb, %s::text, NULL, '', '',
    %s::jsonb, statement_timestamp(), statement_timestamp(), %s::text, %s::smallint,
    statement_timestamp() + make_interval(secs => %s), %s::text)
RETURNING {{task_columns}},
    clock_timestamp() AS claimed_at

-- name: purge_select
-- Row locks make a concurrent reset wait, and a row it already moved out of the finished states no
-- longer matches once locked.
SELECT id FROM django_taskclaim_task WHERE status IN (%s, ...) AND updated_at < %s
ORDER BY id LIMIT %s FOR UPDATE

-- name: requeue
-- A reclaimed task's new dispatch (JSON; task id, the token it was reclaimed with), if it is still
-- pending under that token: the sweeper re-sends it.
UPDATE django_taskclaim_task SET dispatch = %s::jsonb, updated_at = statement_timestamp()
WHERE id = %s AND status = 'pending' AND fencing_token = %s

-- name: requeue_stale
-- requeue for a pending task not touched for a number of seconds (JSON; task id; seconds, negative).
UPDATE django_taskclaim_task SET dispatch = %s::jsonb, updated_at = statement_timestamp()
WHERE id = %s AND status = 'pending' AND updated_at < (statement_timestamp() + make_interval(secs => %s))

-- name: fail_exhausted
-- The claim (error, task id, token) whose lease expired with no attempts left: failed.
UPDATE django_taskclaim_task
SET status = 'failed', error = %s, lease_expires_at = NULL, updated_at = statement_timestamp()
WHERE id = %s AND status = 'running' AND fencing_token = %s
  AND lease_expires_at < statement_timestamp() AND attempts >= max_attempts

-- name: close_expired_attempt
-- Its attempt row (task id, token), if still open: expired.
UPDATE django_taskclaim_attempt SET outcome = 'expired', ended_at = statement_timestamp()
WHERE task_id = %s AND token = %s AND outcome = 'running'

-- name: read_task
-- The task (tenant, key): its row, or none.
SELECT {{task_columns}}
FROM django_taskclaim_task WHERE tenant = %s AND "key" = %s

-- name: inserted_unless_key_exists
-- A part: an insert's end (ensure's, new_task_insert's): nothing where the key exists; the row
-- inserted and its claimed_at.
ON CONFLICT (tenant, "key") DO NOTHING
RETURNING {{task_columns}},
    clock_timestamp() AS claimed_at

-- name: ensure
-- A new pending task unless its (tenant, key) exists (tenant, key, max_attempts, payload,
-- fingerprint, dispatch, queue, priority, run_after, task path): its row, or none.
{{task_insert}}
VALUES (%s::text, %s::text, 'pending', '', 0, 0, %s::integer, NULL, %s::jsonb, %s::text, NULL, '', '',
    %s::jsonb, statement_timestamp(), statement_timestamp(), %s::text, %s::smallint, %s::timestamptz, %s::text)
{{inserted_unless_key_exists}}

-- -- epochs (DESIGN §13; django_taskclaim/store/epochs.py: the layout and its bounds) ----------------

-- name: epoch_floor
-- A part: the current epoch's floor, taskclaim_epoch_floor() (migration 0013: the server's timeline,
-- then the bumps counted on it; store/epochs.py), read in the claim's own statement (no race with a
-- promotion). A scalar subquery: an InitPlan, one call a statement whatever the rows it claims.
(SELECT taskclaim_epoch_floor())

-- name: epoch_read
-- The epoch: the server's timeline, the bumps counted on it, the floor (taskclaim_epoch_floor()).
SELECT w.tl, COALESCE((SELECT e.bumps FROM django_taskclaim_epoch e WHERE e.id = 1 AND e.timeline = w.tl), 0),
    taskclaim_epoch_floor()
FROM (SELECT ('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint AS tl) w

-- name: epoch_bump
-- One more bump on the server's timeline (the limit of bumps a timeline takes): the first on a
-- timeline starts again from 1, since a bump of an older timeline no longer counts. No row: at the
-- limit.
WITH w AS (SELECT ('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint AS tl)
UPDATE django_taskclaim_epoch e SET timeline = w.tl, bumps = CASE WHEN e.timeline = w.tl THEN e.bumps + 1 ELSE 1 END,
    bumped_at = statement_timestamp()
FROM w WHERE e.id = 1 AND (e.timeline <> w.tl OR e.bumps < %s)

-- -- claims by key -------------------------------------------------------------------------------
-- A claim by key is one statement with its audit rows. Which of its forms a session sends follows
-- what its last claim met (PostgreSQLStore.claim_key): claim_new after a claim that inserted (the
-- next key is most likely new too), claim_key after one that claimed an existing task,
-- claim_key_or_duplicate after one that met a task it could not claim. Each has an _unaudited
-- form (TASKCLAIM_AUDIT off: no attempt rows). Every form gives the same answers, at most one
-- round trip later. Each text stays under psycopg's 4 KiB statement cache (each list of columns
-- written once: c.*, cur.*; tests/store/postgresql/test_postgresql.py).
--
-- The claimed task's row is followed by claimed_at: clock_timestamp(), read after the row lock
-- and the re-check, not statement_timestamp() (when the statement *arrived*: a claim that arrived
-- while the owner still held the row inside fenced(), and ran after its release committed, would be
-- stamped before the release ended the previous attempt). So attempts of a task are stamped in the
-- order they happened. decode() reads the task's columns by position, before it.

-- name: new_task_insert
-- A part: the insert of a key's task, claimed (tenant, key, owner, max_attempts, lease seconds,
-- payload, fingerprint); its forms say when it runs, then inserted_unless_key_exists.
{{task_insert}}
SELECT %s::text, %s::text, 'running', %s::text, {{epoch_floor}} + 1, 1, %s::integer,
    statement_timestamp() + make_interval(secs => %s), %s::jsonb, %s::text, NULL, '', '', NULL,
    statement_timestamp(), statement_timestamp(), NULL, 0, NULL, ''

-- name: attempt_opened
-- A part: the claimed task's attempt row opened at claimed_at (the delivery id).
opened AS (
    {{attempt_insert}}
    SELECT c.id, c.fencing_token, c.owner, %s, c.claimed_at, NULL, 'running', 0, '', '', '' FROM claimed c)

-- name: claim_new
-- The claim of a key that has no task yet (tenant, key, owner, max_attempts, lease seconds, payload,
-- fingerprint; delivery id): the insert alone, and its attempt row. The update of an existing task
-- (an index probe) and the close of a taken-over attempt are server work a new key never needs.
-- Where the key exists this inserts nothing and writes nothing (no WAL flush): no row, and the store
-- sends claim_key_or_duplicate.
WITH claimed AS (
    {{new_task_insert}}
    {{inserted_unless_key_exists}}),
{{attempt_opened}}
SELECT c.* FROM claimed c

-- name: claim_new_unaudited
-- claim_new without its attempt row (the same parameters, without the delivery id).
WITH claimed AS (
    {{new_task_insert}}
    {{inserted_unless_key_exists}})
SELECT c.* FROM claimed c

-- name: key_claimed
-- A part: claim_key's upd, ins and claimed (its parameters up to the delivery id; claim_key says why).
upd AS (
    UPDATE django_taskclaim_task t
    SET status = 'running', owner = %s, fencing_token = {{next_token}}, attempts = t.attempts + 1,
        lease_expires_at = statement_timestamp() + make_interval(secs => %s), updated_at = statement_timestamp(),
        payload = CASE WHEN t.payload_fingerprint = '' THEN %s::jsonb ELSE t.payload END,
        payload_fingerprint = CASE WHEN t.payload_fingerprint = '' THEN %s ELSE t.payload_fingerprint END
    WHERE t.tenant = %s AND t."key" = %s
      AND ((t.status = 'pending'
            OR (t.status = 'running' AND t.lease_expires_at < statement_timestamp() AND t.attempts < t.max_attempts))
           AND t.queue IS NULL)
      AND (%s::text = '' OR t.payload_fingerprint IN ('', %s::text))
    RETURNING t.id, t.tenant, t."key", t.status, t.owner, t.fencing_token, t.attempts, t.max_attempts,
        t.lease_expires_at, t.payload::text AS payload, t.payload_fingerprint, t.result::text AS result,
        t.result_ref, t.error, t.dispatch::text AS dispatch, t.created_at, t.updated_at, t.queue, t.priority,
        t.run_after, t.task_path, clock_timestamp() AS claimed_at),
ins AS (
    {{new_task_insert}}
    WHERE NOT EXISTS (SELECT 1 FROM upd)
    {{inserted_unless_key_exists}}),
claimed AS (SELECT * FROM upd UNION ALL SELECT * FROM ins)

-- name: attempt_taken_over
-- A part: the attempt a claim took over (a lower token, still running: the one before, or the last of
-- an earlier epoch) closed at claimed_at; claim_key says why so.
closed AS (
    UPDATE django_taskclaim_attempt a SET outcome = 'taken_over', ended_at = (SELECT claimed_at FROM claimed)
    WHERE a.task_id = (SELECT id FROM claimed) AND a.token < (SELECT fencing_token FROM claimed)
      AND a.outcome = 'running'
    RETURNING a.task_id, a.owner)

-- name: key_read
-- A part: the key's task (tenant, key) when nothing was claimed, with no claimed_at and whether its lease expired.
cur AS (
    SELECT {{task_columns}},
        NULL::timestamptz, (lease_expires_at < statement_timestamp()) AS expired
    FROM django_taskclaim_task WHERE tenant = %s AND "key" = %s AND NOT EXISTS (SELECT 1 FROM claimed))

-- name: duplicate_recorded
-- A part: the duplicate delivery's audit row (owner, delivery id, fingerprint twice), where cur is a
-- duplicate; claim_key_or_duplicate says why it locks the task row.
dup AS (
    {{attempt_insert}}
    SELECT t.id, NULL, %s, %s, statement_timestamp(), statement_timestamp(), 'duplicate', 0, '', '', ''
    FROM cur JOIN django_taskclaim_task t ON t.id = cur.id
    WHERE (cur.status = 'succeeded' OR (cur.status = 'running' AND NOT cur.expired)) AND cur.queue IS NULL
      AND (%s::text = '' OR cur.payload_fingerprint IN ('', %s::text))
    FOR KEY SHARE OF t
    RETURNING 1)

-- name: claim_key
-- Take over the key's task where it is claimable, or insert it (upd: owner, lease seconds, payload,
-- fingerprint, tenant, key, fingerprint twice; ins: claim_new's seven; opened: the delivery id).
--
-- upd: a task is claimable when pending, or running with an expired lease and attempts left, and
-- not queued (a queued task belongs to the queue workers: lifecycle.transitions.refuse_other_work);
-- the claim's payload must fit the task's (none given, none stored, or the same). A task first
-- named without a payload keeps the first payload a claim brings. Not INSERT … ON CONFLICT DO
-- UPDATE … WHERE: that locks the conflicting row even when its WHERE is false, so the losers of a
-- race on one key would each hold the row lock until their own commit (a WAL flush) and be decided
-- one after another. An UPDATE whose WHERE fails on the row version it waited for (re-checked under
-- READ COMMITTED) locks nothing, nor does ON CONFLICT DO NOTHING: losers are decided together,
-- without writing. A row committed after this statement's snapshot makes it claim nothing; the
-- lifecycle reads the row and tries again when it is claimable.
--
-- closed, opened: the attempt taken over (a lower token, still running) closed and the new one
-- opened, both at claimed_at. The attempt is looked up in the unique (task_id, token) index by
-- values of scalar subqueries (a task's attempts below its token: few), which the planner turns
-- into an index lookup whatever it believes of the table's size: a join against claimed can be
-- planned as a sequential scan of the attempt table while its statistics still say "small", and a
-- prepared statement keeps that plan while the table grows.
--
-- One row when claimed: the task's columns, claimed_at, NULL (expired: not asked), the owner it
-- was taken over from, true (claimed), 0 (no duplicate recorded). No row when nothing was claimed:
-- the lifecycle reads the task (read_and_record_duplicate) and decides.
WITH {{key_claimed}},
{{attempt_taken_over}},
{{attempt_opened}}
SELECT c.*, NULL::boolean, (SELECT cl.owner FROM closed cl WHERE cl.task_id = c.id LIMIT 1), true, 0::bigint
FROM claimed c

-- name: claim_key_unaudited
-- claim_key without the attempt rows (its parameters without the delivery id).
WITH {{key_claimed}}
SELECT c.*, NULL::boolean, NULL::text, true, 0::bigint FROM claimed c

-- name: claim_key_or_duplicate
-- claim_key (its parameters), and when it claims nothing, the duplicate's read and record (cur:
-- tenant, key; dup: owner, delivery id, fingerprint twice): one round trip for the common
-- duplicate, a task that existed before. Not claim_key's form for every claim: the read and the
-- record cost every claim server CPU, duplicate or not (the executor sets up their nodes even when
-- they do nothing).
--
-- The read sees the task as of this statement's snapshot: a task inserted by a racing claim after
-- that is invisible here, and the lifecycle then reads it with read_and_record_duplicate. Only a
-- duplicate is answered here; anything else (pending, an expired lease, a payload mismatch) goes to
-- that fresh read too. dup locks the task row (FOR KEY SHARE, as its foreign key check would): a
-- task deleted by a concurrent purge since the snapshot is skipped instead of failing the foreign
-- key at commit, and a purge that comes later waits for this row. Nothing inserted: the task
-- vanished. Only a statement that recorded a duplicate (and so claimed nothing) commits
-- asynchronously (cfg, transaction-local); a claim always waits for its flush.
--
-- Rows of claim_key's shape: when nothing was claimed, the task read (cur), NULL (no previous
-- owner), false (not claimed), and the duplicates recorded (0 or 1).
WITH {{key_claimed}},
{{attempt_taken_over}},
{{attempt_opened}},
{{key_read}},
{{duplicate_recorded}},
cfg AS (SELECT set_config('synchronous_commit', 'off', true) FROM dup)
SELECT c.*, NULL::boolean, (SELECT cl.owner FROM closed cl WHERE cl.task_id = c.id LIMIT 1), true, 0::bigint
FROM claimed c
UNION ALL
SELECT cur.*, NULL::text, false, (SELECT count(*) FROM dup) + 0 * (SELECT count(*) FROM cfg) FROM cur

-- name: claim_key_or_duplicate_in_transaction
-- claim_key_or_duplicate inside a caller's transaction (the same parameters): the caller's commit
-- is synchronous, so no cfg.
WITH {{key_claimed}},
{{attempt_taken_over}},
{{attempt_opened}},
{{key_read}},
{{duplicate_recorded}}
SELECT c.*, NULL::boolean, (SELECT cl.owner FROM closed cl WHERE cl.task_id = c.id LIMIT 1), true, 0::bigint
FROM claimed c
UNION ALL
SELECT cur.*, NULL::text, false, (SELECT count(*) FROM dup) FROM cur

-- name: claim_key_or_duplicate_unaudited
-- claim_key_unaudited (its parameters), and when it claims nothing, the task read (tenant, key);
-- no duplicate recorded.
WITH {{key_claimed}},
{{key_read}}
SELECT c.*, NULL::boolean, NULL::text, true, 0::bigint FROM claimed c
UNION ALL
SELECT cur.*, NULL::text, false, 0::bigint FROM cur

-- name: read_and_record_duplicate
-- What a claim by key that claimed nothing met (tenant, key), and the duplicate delivery recorded
-- (owner, delivery id, fingerprint twice) in one round trip, as claim_key_or_duplicate's cur and
-- dup: the task's row, whether its lease expired, the duplicates recorded, and 1 (cfg: committed
-- asynchronously; the audit row decides nothing, so losers need not wait for a WAL flush; a server
-- crash may drop the newest of these rows, while claims, results and stale-write counts stay
-- synchronous).
WITH cur AS (
    SELECT {{task_columns}},
        (lease_expires_at < statement_timestamp()) AS expired
    FROM django_taskclaim_task WHERE tenant = %s AND "key" = %s),
{{duplicate_recorded}},
cfg AS (SELECT set_config('synchronous_commit', 'off', true))
SELECT cur.*, (SELECT count(*) FROM dup), (SELECT count(*) FROM cfg) FROM cur

-- name: read_and_record_duplicate_in_transaction
-- read_and_record_duplicate inside a caller's transaction (the same parameters): its commit stays
-- synchronous (0 in the last column).
WITH cur AS (
    SELECT {{task_columns}},
        (lease_expires_at < statement_timestamp()) AS expired
    FROM django_taskclaim_task WHERE tenant = %s AND "key" = %s),
{{duplicate_recorded}}
SELECT cur.*, (SELECT count(*) FROM dup), 0 FROM cur

-- name: read_state
-- What a claim by key that claimed nothing met (tenant, key), without the audit: the task's row,
-- whether its lease expired, 0, 0 (read_and_record_duplicate's shape).
SELECT {{task_columns}},
    (lease_expires_at < statement_timestamp()) AS expired, 0, 0
FROM django_taskclaim_task WHERE tenant = %s AND "key" = %s

-- -- an owner's endings: one statement, one commit ---------------------------------------------
-- Each ending (complete, fail, release) in four forms: alone (TASKCLAIM_AUDIT off), _audited (its
-- attempt row closed in the same statement: looked up by its unique (task_id, token) as
-- parameters, an index lookup; a join against t can be planned as a sequential scan of the
-- attempt table), and _then_start / _audited_then_start: a worker's reserved claim started in the
-- same commit if the ending matched (Start in store/rows.py).

-- name: attempt_ended
-- A part: the ending's attempt row closed (the outcome if the task is pending again, else; task id,
-- token), where t (the ending) matched.
a AS (
    UPDATE django_taskclaim_attempt
    SET outcome = CASE WHEN (SELECT status FROM t) = 'pending' THEN %s ELSE %s END,
        ended_at = statement_timestamp()
    WHERE task_id = %s AND token = %s AND EXISTS (SELECT 1 FROM t))

-- name: attempt_failed
-- A part: attempt_ended for a failure, its error kept (outcomes; error, class, traceback; task id, token).
a AS (
    UPDATE django_taskclaim_attempt
    SET outcome = CASE WHEN (SELECT status FROM t) = 'pending' THEN %s ELSE %s END,
        ended_at = statement_timestamp(), error = %s::text, error_class = %s::text, traceback = %s::text
    WHERE task_id = %s AND token = %s AND EXISTS (SELECT 1 FROM t))

-- name: start_lease
-- A part: a reserved claim started (lease seconds, task id, token): start says what it does; its
-- forms say what it returns.
UPDATE django_taskclaim_task
SET attempts = attempts + 1, lease_expires_at = statement_timestamp() + make_interval(secs => %s),
    updated_at = statement_timestamp()
WHERE id = %s AND status = 'running' AND fencing_token = %s

-- name: then_started
-- A part: the reserved claim started (start_lease) if the ending t matched.
s AS (
    {{start_lease}} AND EXISTS (SELECT 1 FROM t)
    RETURNING id, fencing_token, lease_expires_at)

-- name: attempt_started
-- A part: the started claim's attempt row (owner, delivery id).
sa AS (
    {{attempt_insert}}
    SELECT s.id, s.fencing_token, %s, %s, statement_timestamp(), NULL, 'running', 0, '', '', '' FROM s)

-- name: complete
-- The claim's task (result JSON, result_ref; task id, token) succeeded, if the claim still holds it.
-- Its status, or no row when fenced off.
UPDATE django_taskclaim_task
SET status = 'succeeded', result = %s::jsonb, result_ref = %s, error = '',
    lease_expires_at = NULL, updated_at = statement_timestamp()
WHERE id = %s AND status = 'running' AND fencing_token = %s
RETURNING status

-- name: complete_audited
-- complete and its attempt row closed, in one statement; then
-- the attempt's outcome if the task is pending again, its outcome else; task id, token.
WITH t AS (
    {{complete}}),
{{attempt_ended}}
SELECT status FROM t

-- name: complete_then_start
-- complete, and if it matched, the worker's reserved claim started in the same commit (lease
-- seconds, its task id, token): the status and the started claim's lease expiry (NULL: fenced off).
WITH t AS (
    {{complete}}),
{{then_started}}
SELECT status, (SELECT lease_expires_at FROM s) FROM t

-- name: complete_audited_then_start
-- complete_audited, then complete_then_start's start with its attempt row (owner, delivery id).
WITH t AS (
    {{complete}}),
{{attempt_ended}},
{{then_started}},
{{attempt_started}}
SELECT status, (SELECT lease_expires_at FROM s) FROM t

-- name: fail
-- The claim's task (retry, retry, error, retry, backoff seconds or NULL; task id, token) failed:
-- pending again when retried with attempts left ("not before" now + backoff, if any), else failed.
-- Its status, or no row when fenced off.
UPDATE django_taskclaim_task
SET status = CASE WHEN %s::boolean AND attempts < max_attempts THEN 'pending' ELSE 'failed' END,
    owner = CASE WHEN %s::boolean AND attempts < max_attempts THEN '' ELSE owner END,
    error = %s::text,
    run_after = CASE WHEN %s::boolean AND attempts < max_attempts
                     THEN COALESCE(statement_timestamp() + make_interval(secs => %s), run_after)
                     ELSE run_after END,
    lease_expires_at = NULL, updated_at = statement_timestamp()
WHERE id = %s AND status = 'running' AND fencing_token = %s
RETURNING status

-- name: fail_audited
-- fail and its attempt row closed, in one statement; then
-- the attempt's outcome if the task is pending again, its outcome else, error, error class,
-- traceback; task id, token.
WITH t AS (
    {{fail}}),
{{attempt_failed}}
SELECT status FROM t

-- name: fail_then_start
-- fail, and if it matched, the worker's reserved claim started in the same commit (lease
-- seconds, its task id, token): the status and the started claim's lease expiry (NULL: fenced off).
WITH t AS (
    {{fail}}),
{{then_started}}
SELECT status, (SELECT lease_expires_at FROM s) FROM t

-- name: fail_audited_then_start
-- fail_audited, then fail_then_start's start with its attempt row (owner, delivery id).
WITH t AS (
    {{fail}}),
{{attempt_failed}},
{{then_started}},
{{attempt_started}}
SELECT status, (SELECT lease_expires_at FROM s) FROM t

-- name: release
-- The claim's task (delay seconds or NULL, reason or NULL; task id, token) pending again,
-- untouched: this attempt does not count. Not claimed again before the delay is over; the reason
-- kept as its error.
-- Its status, or no row when fenced off.
UPDATE django_taskclaim_task
SET status = 'pending', owner = '', attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END,
    run_after = COALESCE(statement_timestamp() + make_interval(secs => %s), run_after),
    error = COALESCE(%s::text, error),
    lease_expires_at = NULL, updated_at = statement_timestamp()
WHERE id = %s AND status = 'running' AND fencing_token = %s
RETURNING status

-- name: release_audited
-- release and its attempt row closed, in one statement; then
-- the attempt's outcome if the task is pending again, its outcome else; task id, token.
WITH t AS (
    {{release}}),
{{attempt_ended}}
SELECT status FROM t

-- name: release_then_start
-- release, and if it matched, the worker's reserved claim started in the same commit (lease
-- seconds, its task id, token): the status and the started claim's lease expiry (NULL: fenced off).
WITH t AS (
    {{release}}),
{{then_started}}
SELECT status, (SELECT lease_expires_at FROM s) FROM t

-- name: release_audited_then_start
-- release_audited, then release_then_start's start with its attempt row (owner, delivery id).
WITH t AS (
    {{release}}),
{{attempt_ended}},
{{then_started}},
{{attempt_started}}
SELECT status, (SELECT lease_expires_at FROM s) FROM t

-- name: unreserve
-- A reserved claim (task id, token), never started, given back: pending, its attempt count unchanged.
UPDATE django_taskclaim_task
SET status = 'pending', owner = '', lease_expires_at = NULL, updated_at = statement_timestamp()
WHERE id = %s AND status = 'running' AND fencing_token = %s
RETURNING status

-- name: start
-- Start a reserved claim (lease seconds, task id, token): its attempt counted, its lease the full
-- one from now; the new expiry, no row when the claim no longer holds the task.
{{start_lease}}
RETURNING lease_expires_at

-- name: start_audited
-- start and its attempt row (owner, delivery id), committed together.
WITH s AS (
    {{start_lease}}
    RETURNING id, fencing_token, lease_expires_at),
{{attempt_started}}
SELECT lease_expires_at FROM s

-- -- the sweeper and operators: one statement each, with the audit rows -------------------------

-- name: expired_moved
-- A part: reclaim's victims and moved (a number of claims; reclaim says what it does).
victims AS (
    SELECT id FROM django_taskclaim_task WHERE status = 'running' AND lease_expires_at < statement_timestamp()
    ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED),
moved AS (
    UPDATE django_taskclaim_task t
    SET status = CASE WHEN t.attempts < t.max_attempts THEN 'pending' ELSE 'failed' END,
        owner = CASE WHEN t.attempts < t.max_attempts THEN '' ELSE t.owner END,
        error = CASE WHEN t.attempts < t.max_attempts THEN t.error ELSE 'lease expired with no attempts left' END,
        lease_expires_at = NULL, updated_at = statement_timestamp()
    FROM victims v
    WHERE t.id = v.id AND t.status = 'running' AND t.lease_expires_at < statement_timestamp()
    RETURNING t.id, t."key", t.tenant, t.fencing_token, t.status)

-- name: reclaim
-- Expired claims (at most a number of them, oldest id first; NULL: all) moved on: pending again
-- with attempts left, else failed ("lease expired with no attempts left"). The owner is cleared with
-- the lease (the attempt log keeps who held it). SKIP LOCKED: a claim a transaction holds is left
-- to the next sweep. Each task moved (id, key, tenant, token, new status), in id order.
WITH {{expired_moved}}
SELECT * FROM moved ORDER BY id

-- name: reclaim_audited
-- reclaim, and the attempt rows of the claims it moved closed: expired.
WITH {{expired_moved}},
closed AS (
    UPDATE django_taskclaim_attempt a SET outcome = 'expired', ended_at = statement_timestamp()
    FROM moved m WHERE a.task_id = m.id AND a.token = m.fencing_token AND a.outcome = 'running')
SELECT * FROM moved ORDER BY id

-- name: held_moved
-- A part: force_release's held and moved (ids and tokens; force_release says what it does).
held AS (SELECT * FROM unnest(%s::bigint[], %s::bigint[]) AS h(id, token)),
moved AS (
    UPDATE django_taskclaim_task t
    SET status = 'pending', owner = '', attempts = CASE WHEN t.attempts > 0 THEN t.attempts - 1 ELSE 0 END,
        lease_expires_at = NULL, updated_at = statement_timestamp()
    FROM held h
    WHERE t.id = h.id AND t.fencing_token = h.token AND t.status = 'running'
    RETURNING t.id, t."key", t.tenant, t.fencing_token, t.status)

-- name: force_release
-- Claims (their ids and tokens: two arrays of one length) released by an operator, as their owners
-- release (see release): pending, this attempt not counted. Each task moved, in id order.
WITH {{held_moved}}
SELECT * FROM moved ORDER BY id

-- name: force_release_audited
-- force_release, and the attempt rows of the claims it released closed: released.
WITH {{held_moved}},
closed AS (
    UPDATE django_taskclaim_attempt a SET outcome = 'released', ended_at = statement_timestamp()
    FROM moved m WHERE a.task_id = m.id AND a.token = m.fencing_token AND a.outcome = 'running')
SELECT * FROM moved ORDER BY id

-- name: cancelled_moved
-- A part: cancel's moved (an array of ids; cancel says what it does).
moved AS (
    UPDATE django_taskclaim_task
    SET status = 'cancelled', lease_expires_at = NULL, updated_at = statement_timestamp()
    WHERE id = ANY(%s::bigint[]) AND status IN ('pending', 'running')
    RETURNING id)

-- name: cancel
-- Pending or running tasks (an array of ids) cancelled: how many.
WITH {{cancelled_moved}}
SELECT count(*) FROM moved

-- name: cancel_audited
-- cancel, and the open attempt rows of the tasks it cancelled closed: cancelled.
WITH {{cancelled_moved}},
closed AS (
    UPDATE django_taskclaim_attempt a SET outcome = 'cancelled', ended_at = statement_timestamp()
    FROM moved m WHERE a.task_id = m.id AND a.outcome = 'running')
SELECT count(*) FROM moved

-- -- many tasks at once ------------------------------------------------------------------------

-- name: ensure_many
-- New pending tasks unless their (tenant, key) exists: each column's values as one array (tenant,
-- key, max_attempts, payload, fingerprint, dispatch, queue, priority, run_after, task_path), so one
-- text whatever the number of tasks (a VALUES list is a text per row count). Binary parameters
-- (%b): psycopg quotes each element of a text-format array in Python, ten times the cost of the
-- whole binary array for 1,000 tasks. In the order given (WITH ORDINALITY): ids, and so the
-- queue's order among equal priorities, follow it. Of each row inserted: id, tenant, key,
-- created_at, payload (as stored).
{{task_insert}}
SELECT v.tenant, v.key, 'pending', '', 0, 0, v.max_attempts, NULL, v.payload::jsonb, v.payload_fingerprint,
    NULL, '', '', v.dispatch::jsonb, statement_timestamp(), statement_timestamp(), v.queue, v.priority,
    v.run_after, v.task_path
FROM unnest(%b::text[], %b::text[], %b::integer[], %b::text[], %b::text[], %b::text[], %b::text[],
    %b::smallint[], %b::timestamptz[], %b::text[])
    WITH ORDINALITY AS v(tenant, key, max_attempts, payload, payload_fingerprint, dispatch, queue, priority,
    run_after, task_path, n)
ORDER BY v.n
ON CONFLICT (tenant, "key") DO NOTHING
RETURNING id, tenant, "key", created_at, payload::text

-- name: read_tasks
-- The tasks (their tenants and keys: two arrays of one length, binary), those that exist.
SELECT {{task_columns}}
FROM django_taskclaim_task WHERE (tenant, "key") IN (SELECT * FROM unnest(%b::text[], %b::text[]))

-- The queue claim (claim_next; complete_and_claim_next, after a completion in the same statement).
-- One statement, written once: its {{slots}} take the parts below that the call names
-- (PostgreSQLStore.queue_claim_parts), 64 forms, each prepared (six, audited, reserving and after a
-- completion, are longer than psycopg's cache of converted statements, 4,096 bytes). Two candidate lists, each served by its partial index; SKIP LOCKED so that workers never
-- queue behind each other; the UPDATE re-checks the claim predicate. An expired task on its last
-- attempt ends FAILED here (as reclaim would end it): a queue without a reclaim sweep strands
-- nothing. The claim updates the picked rows by their ids, an array of them: a prepared statement's
-- generic plan cannot know that picked holds "limit" rows at most, and joined against it, planned
-- the update as a scan of the whole task table (tests/store/postgresql/test_postgresql.py).
-- Concurrency limits: the pending candidates pass over a full key's tasks (taskclaim_room(), in the
-- statement's snapshot) and the claim keeps only the picked tasks taskclaim_fit() returns (migration
-- 0008 and after): called only when a picked task has a key (a subplan run at its first use), so
-- unlimited work never pays for it. It locks each limited key's gate row (in key order), then counts
-- the key's running tasks in a snapshot taken after the lock. The task a completion ends in the same
-- statement ({{done_id}}) is still running in its snapshots, and is not counted.
-- Parameters: the completion's ({{completion}}); the expired candidates' (queues, tenant, the
-- completed task, limit); the pending ones' (queues, tenant, completed task, limit, and with several
-- queues the limit of all); the limit of picked; the claim's (owner, lease, reservation, completed
-- task); the audit's delivery id. Rows: the claimed tasks (clock_timestamp() at the claim, the owner
-- taken over from, 1 started or 2 reserved), then the exhausted ones (0); after a completion, its
-- count in every row (one row of NULLs when nothing was claimed).
-- name: queue_claim
WITH {{completion}} expired AS MATERIALIZED (SELECT t.id, t.priority, t.attempts < t.max_attempts AS again
    FROM django_taskclaim_task t
    WHERE t.status = 'running' AND t.lease_expires_at < statement_timestamp()
    AND {{queues}} AND {{path}} {{tenant}} {{only_if_done}} {{exclude}}
    ORDER BY t.id LIMIT %s FOR UPDATE SKIP LOCKED),
exhausted AS (UPDATE django_taskclaim_task x SET status = 'failed', error = 'lease expired with no attempts left',
    lease_expires_at = NULL, updated_at = statement_timestamp()
    FROM expired e WHERE x.id = e.id AND NOT e.again AND x.status = 'running'
    RETURNING x.id, x.tenant, x."key", x.status, x.owner, x.fencing_token, x.attempts, x.max_attempts,
    x.lease_expires_at, x.payload::text AS payload, x.payload_fingerprint, x.result::text AS result,
    x.result_ref, x.error, x.dispatch::text AS dispatch, x.created_at, x.updated_at, x.queue, x.priority,
    x.run_after, x.task_path, clock_timestamp() AS claimed_at),
pending AS MATERIALIZED ({{pending}}),
picked AS (SELECT id, priority FROM expired WHERE again UNION ALL SELECT id, priority FROM pending LIMIT %s),
{{first}} claimed AS (UPDATE django_taskclaim_task q SET {{claim_set}}
    WHERE q.id = ANY(ARRAY(SELECT id FROM picked))
    AND (q.concurrency_key = '' OR q.id IN (SELECT taskclaim_fit(ARRAY(SELECT id FROM picked), {{done_id}})))
    AND (q.status = 'pending'
         OR (q.status = 'running' AND q.lease_expires_at < statement_timestamp() AND q.attempts < q.max_attempts))
    RETURNING q.id, q.tenant, q."key", q.status, q.owner, q.fencing_token, q.attempts, q.max_attempts,
    q.lease_expires_at, q.payload::text AS payload, q.payload_fingerprint, q.result::text AS result,
    q.result_ref, q.error, q.dispatch::text AS dispatch, q.created_at, q.updated_at, q.queue, q.priority,
    q.run_after, q.task_path, clock_timestamp() AS claimed_at){{audit}}
{{results}}

-- name: claim_done
-- {{completion}}: the task completed before the claim (result, result_ref, id, token), fenced by its token.
done AS (UPDATE django_taskclaim_task SET status = 'succeeded', result = %s::jsonb, result_ref = %s, error = '',
    lease_expires_at = NULL, updated_at = statement_timestamp()
    WHERE django_taskclaim_task.id = %s AND django_taskclaim_task.status = 'running'
    AND django_taskclaim_task.fencing_token = %s RETURNING id),

-- name: claim_done_audited
-- The completion and its attempt row (id, token), ended only if the completion matched.
{{claim_done}} done_attempt AS (UPDATE django_taskclaim_attempt SET outcome = 'succeeded',
    ended_at = statement_timestamp() WHERE task_id = %s AND token = %s AND EXISTS (SELECT 1 FROM done)),

-- name: one_queue
-- {{queues}}: one queue by equality, its name: the queued index gives its tasks in order (priority, id).
t.queue = %s::text

-- name: any_queue
-- Several queues, as one array whatever their number.
t.queue = ANY(%s::text[])

-- name: handler_work
-- {{path}}: work for a handler (tasks that name no callable).
t.task_path = ''

-- name: task_paths
-- Tasks that name the callable that runs them.
t.task_path <> ''

-- name: of_tenant
-- {{tenant}}: only the tenant's tasks (a tenant).
AND t.tenant = %s::text

-- name: after_done
-- {{only_if_done}}: no task is picked unless the completion matched.
AND EXISTS (SELECT 1 FROM done)

-- name: not_done
-- {{exclude}}: never the completed task (its id): one statement may not update a row twice.
AND t.id <> %s

-- name: completed_task
-- {{done_id}}: the completed task (its id), for the limits' counts.
%s

-- name: no_task
NULL

-- name: due_with_room
-- A due pending task, of a key with room.
t.status = 'pending' AND (t.run_after IS NULL OR t.run_after <= statement_timestamp()) {{only_if_done}}
AND (t.concurrency_key = '' OR taskclaim_room(t.id, {{done_id}}))

-- name: pending_of_one_queue
-- {{pending}}: one queue's first due tasks, from the queued index in claim order (no sort).
SELECT t.id, t.priority FROM django_taskclaim_task t WHERE {{queues}} AND {{path}} {{tenant}} AND {{due_with_room}}
ORDER BY t.priority DESC, t.id LIMIT %s FOR UPDATE SKIP LOCKED

-- name: pending_of_each_queue
-- Several queues: each queue's first tasks from the queued index (as one queue's), then the first of
-- those. One sort of the whole backlog of the queues instead would cost every claim time in proportion
-- to the tasks waiting. The candidates of each queue are locked for the statement, and those not picked
-- are left as they were.
SELECT c.id, c.priority FROM unnest(%s::text[]) AS n(queue) CROSS JOIN LATERAL (SELECT t.id, t.priority FROM django_taskclaim_task t WHERE t.queue = n.queue AND {{path}} {{tenant}}
    AND {{due_with_room}} ORDER BY t.priority DESC, t.id LIMIT %s FOR UPDATE SKIP LOCKED) c
ORDER BY c.priority DESC, c.id LIMIT %s

-- name: first_to_start
-- {{first}}: the task a reserving claim starts, the first to run of those it picked, by the priority
-- picked carries (a join back to the task table would be planned as a scan of it).
first AS (SELECT id FROM picked ORDER BY priority DESC, id LIMIT 1),

-- name: start_claimed
-- {{claim_set}}: every picked task started (owner, lease in seconds).
status = 'running', owner = %s, fencing_token = {{next_token}}, attempts = q.attempts + 1,
lease_expires_at = statement_timestamp() + make_interval(secs => %s), updated_at = statement_timestamp()

-- name: start_first_reserve_rest
-- A reserving claim: only the first task started (its attempt counted, the lease), the others reserved
-- (owner, lease, reservation in seconds).
status = 'running', owner = %s, fencing_token = {{next_token}},
attempts = q.attempts + (q.id = (SELECT id FROM first))::int,
lease_expires_at = CASE WHEN q.id = (SELECT id FROM first) THEN statement_timestamp() + make_interval(secs => %s)
ELSE statement_timestamp() + make_interval(secs => %s) END, updated_at = statement_timestamp()

-- name: queue_claim_audit
-- {{audit}}: the exhausted tasks' attempts ended expired; the attempts the claim took over (still
-- running: the statement's snapshot does not see the attempts it opens; the token before, or the
-- last of an earlier epoch) closed and the new ones opened (delivery id), both at claimed_at: the
-- clock read once the row was claimed (see claim_key above). A task has one running attempt; were
-- there two, both are closed and one owner named (LIMIT 1), never an error.
, lost AS (UPDATE django_taskclaim_attempt a SET outcome = 'expired', ended_at = statement_timestamp()
    FROM exhausted x WHERE a.task_id = x.id AND a.token = x.fencing_token AND a.outcome = 'running'),
closed AS (UPDATE django_taskclaim_attempt a SET outcome = 'taken_over',
    ended_at = (SELECT c.claimed_at FROM claimed c WHERE c.id = a.task_id)
    WHERE a.task_id = ANY(ARRAY(SELECT id FROM claimed)) AND a.outcome = 'running' RETURNING a.task_id, a.owner),
opened AS ({{attempt_insert}}
    SELECT c.id, c.fencing_token, c.owner, %s, c.claimed_at, NULL, 'running', 0, '', '', '' FROM claimed c
    {{only_first}})

-- name: of_first
-- {{only_first}}: a reserving claim opens the attempt of the task it starts only.
WHERE c.id = (SELECT id FROM first)

-- name: queue_claim_results
-- {{results}}: the claimed tasks, then the exhausted ones.
SELECT c.*, {{previous}}, {{flag}} FROM claimed c UNION ALL SELECT x.*, NULL::text, 0 FROM exhausted x

-- name: queue_claim_results_after_done
-- After a completion: its count in every row, and one row of NULLs when nothing was claimed.
SELECT c.*, {{previous}}, {{flag}}, (SELECT count(*) FROM done) FROM (SELECT 1) one LEFT JOIN claimed c ON true
UNION ALL SELECT x.*, NULL::text, 0, (SELECT count(*) FROM done) FROM exhausted x

-- name: taken_over_from
-- {{previous}}: the owner the claim took the task over from (audited).
(SELECT cl.owner FROM closed cl WHERE cl.task_id = c.id LIMIT 1)

-- name: no_owner
NULL::text

-- name: started
-- {{flag}}: every claimed task started.
1

-- name: first_started
-- A reserving claim: 1 for the task started, 2 for those reserved.
CASE WHEN c.id = (SELECT id FROM first) THEN 1 ELSE 2 END

-- name: store_step
-- A step's result stored under its task (name, JSON, task id, token) while the claim (task id, token)
-- holds the task: nothing when it was fenced off, nor when a step of that name is stored already.
-- FOR SHARE: a takeover's claim (an UPDATE of the row) waits for this statement's commit, and this
-- statement, queued behind a takeover, reads the row it committed (no longer this token): a stale
-- owner never stores a step after the new owner read the task's steps.
INSERT INTO django_taskclaim_step (task_id, name, result, token, created_at)
SELECT id, %s, %s::jsonb, fencing_token, statement_timestamp()
FROM django_taskclaim_task WHERE id = %s AND status = 'running' AND fencing_token = %s
FOR SHARE
ON CONFLICT (task_id, name) DO NOTHING

-- name: read_steps
-- common.sql's read_steps with the result as text (the JSON as stored).
SELECT s.name, s.result::text, s.token FROM django_taskclaim_task t
LEFT JOIN django_taskclaim_step s ON s.task_id = t.id
WHERE t.id = %s AND t.status = 'running' AND t.fencing_token = %s

-- name: read_step
-- common.sql's read_step with the result as text.
SELECT result::text, token FROM django_taskclaim_step WHERE task_id = %s AND name = %s

-- name: report_settings
-- Inside a transaction: a report's (the admin dashboard's) settings until it ends. JIT off: compiling
-- the dashboard's forty aggregate expressions took 3.2 s of a 4.6 s query at 10 million tasks, to
-- run them once over a few hundred thousand rows. work_mem 32 MB: a day's attempts at 10 million
-- tasks (330,000 rows) are sorted in memory, not in temporary files.
SELECT set_config('jit', 'off', true), set_config('work_mem', '32MB', true)
