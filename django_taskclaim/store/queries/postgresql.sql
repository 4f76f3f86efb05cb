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

-- name: refresh_waiting
-- A coalescing group's latest task takes the newest arguments (payload, fingerprint, delay in
-- seconds, task id, task path) if it still waits: pending and never claimed (a claim raises its
-- token; a retried or released task is pending again with its token up). "Not before": now +
-- delay. The row, or none when a claim took the task first (re-checked on the row it locks).
UPDATE django_taskclaim_task
SET payload = %s::jsonb, payload_fingerprint = %s::text,
    run_after = statement_timestamp() + make_interval(secs => %s), updated_at = statement_timestamp()
WHERE id = %s AND status = 'pending' AND fencing_token = 0 AND task_path = %s
RETURNING id, tenant, "key", status, owner, fencing_token, attempts, max_attempts, lease_expires_at,
    payload::text AS payload, payload_fingerprint, result::text AS result, result_ref, error,
    dispatch::text AS dispatch, created_at, updated_at, queue, priority, run_after, task_path,
    clock_timestamp() AS claimed_at

-- name: refresh_waiting_capped
-- refresh_waiting with a max_delay (seconds, after the delay): "not before" now + delay, capped at
-- the group's first enqueue (created_at) + max_delay.
UPDATE django_taskclaim_task
SET payload = %s::jsonb, payload_fingerprint = %s::text,
    run_after = LEAST(statement_timestamp() + make_interval(secs => %s), created_at + make_interval(secs => %s)),
    updated_at = statement_timestamp()
WHERE id = %s AND status = 'pending' AND fencing_token = 0 AND task_path = %s
RETURNING id, tenant, "key", status, owner, fencing_token, attempts, max_attempts, lease_expires_at,
    payload::text AS payload, payload_fingerprint, result::text AS result, result_ref, error,
    dispatch::text AS dispatch, created_at, updated_at, queue, priority, run_after, task_path,
    clock_timestamp() AS claimed_at

-- name: insert_waiting
-- A coalesced task, pending (tenant, key: 128 random bits, max_attempts, payload, fingerprint,
-- dispatch, queue, priority, delay in seconds, task path): "not before" now + delay. Its row.
INSERT INTO django_taskclaim_task (tenant, "key", status, owner, fencing_token, attempts, max_attempts,
    lease_expires_at, payload, payload_fingerprint, result, result_ref, error, dispatch, created_at,
    updated_at, queue, priority, run_after, task_path)
VALUES (%s::text, %s::text, 'pending', '', 0, 0, %s::integer, NULL, %s::jsonb, %s::text, NULL, '', '',
    %s::jsonb, statement_timestamp(), statement_timestamp(), %s::text, %s::smallint,
    statement_timestamp() + make_interval(secs => %s), %s::text)
RETURNING id, tenant, "key", status, owner, fencing_token, attempts, max_attempts, lease_expires_at,
    payload::text AS payload, payload_fingerprint, result::text AS result, result_ref, error,
    dispatch::text AS dispatch, created_at, updated_at, queue, priority, run_after, task_path,
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

-- name: close_running_attempt
-- An attempt row (outcome, task id, token) still open, closed with that outcome.
UPDATE django_taskclaim_attempt SET outcome = %s, ended_at = statement_timestamp()
WHERE task_id = %s AND token = %s AND outcome = 'running'

-- name: read_task
-- The task (tenant, key): its row, or none.
SELECT id, tenant, "key", status, owner, fencing_token, attempts, max_attempts, lease_expires_at,
    payload::text AS payload, payload_fingerprint, result::text AS result, result_ref, error,
    dispatch::text AS dispatch, created_at, updated_at, queue, priority, run_after, task_path
FROM django_taskclaim_task WHERE tenant = %s AND "key" = %s

-- name: ensure
-- A new pending task unless its (tenant, key) exists (tenant, key, max_attempts, payload,
-- fingerprint, dispatch, queue, priority, run_after, task path): its row, or none.
INSERT INTO django_taskclaim_task (tenant, "key", status, owner, fencing_token, attempts, max_attempts,
    lease_expires_at, payload, payload_fingerprint, result, result_ref, error, dispatch, created_at,
    updated_at, queue, priority, run_after, task_path)
VALUES (%s::text, %s::text, 'pending', '', 0, 0, %s::integer, NULL, %s::jsonb, %s::text, NULL, '', '',
    %s::jsonb, statement_timestamp(), statement_timestamp(), %s::text, %s::smallint, %s::timestamptz, %s::text)
ON CONFLICT (tenant, "key") DO NOTHING
RETURNING id, tenant, "key", status, owner, fencing_token, attempts, max_attempts, lease_expires_at,
    payload::text AS payload, payload_fingerprint, result::text AS result, result_ref, error,
    dispatch::text AS dispatch, created_at, updated_at, queue, priority, run_after, task_path,
    clock_timestamp() AS claimed_at
