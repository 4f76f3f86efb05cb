-- SQLite: only the statements whose SQL differs from common.sql (its clock, above all: UTC as text).

-- name: heartbeat
-- Renew the claim's lease ('+60.000 seconds', task id, token): UTC in the text form Django stores
-- datetimes in (six fraction digits), because SQLite compares these columns as text.
UPDATE django_taskclaim_task
SET lease_expires_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s) || '000'),
    updated_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
WHERE id = %s AND status = 'running' AND fencing_token = %s
RETURNING lease_expires_at

-- name: start
-- Start a reserved claim (lease as for heartbeat, task id, token): its attempt counted, its lease
-- the full one from now; the new expiry, no row when the claim no longer holds the task.
UPDATE django_taskclaim_task
SET attempts = attempts + 1, lease_expires_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s) || '000'),
    updated_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
WHERE id = %s AND status = 'running' AND fencing_token = %s
RETURNING lease_expires_at

-- name: heartbeat_many
-- Renew the leases of many claims at once (lease as for heartbeat; the ids, then each claim's id
-- and token): the ids renewed, with their new expiry. A claim missing was fenced off.
UPDATE django_taskclaim_task
SET lease_expires_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s) || '000'),
    updated_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
WHERE id IN (%s, ...) AND status = 'running' AND ((id = %s AND fencing_token = %s) OR ...)
RETURNING id, lease_expires_at

-- name: task_columns
-- A part: a task row's columns in TASK_COLUMNS order, as decode() reads them.
"id", "tenant", "key", "status", "owner", "fencing_token", "attempts", "max_attempts",
"lease_expires_at", "payload", "payload_fingerprint", "result", "result_ref", "error", "dispatch",
"created_at", "updated_at", "queue", "priority", "run_after", "task_path"

-- name: task_insert
-- A part: the insert of a task's row, its columns but id named (in TASK_COLUMNS order).
INSERT INTO django_taskclaim_task ("tenant", "key", "status", "owner", "fencing_token", "attempts",
    "max_attempts", "lease_expires_at", "payload", "payload_fingerprint", "result", "result_ref", "error",
    "dispatch", "created_at", "updated_at", "queue", "priority", "run_after", "task_path")

-- name: refresh_waiting
-- A coalescing group's latest task takes the newest arguments (payload, fingerprint, delay as
-- '+1.000 seconds', task id, task path) if it still waits (see postgresql.sql). Its row, or none.
UPDATE django_taskclaim_task
SET payload = %s, payload_fingerprint = %s,
    run_after = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s) || '000'),
    updated_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
WHERE id = %s AND status = 'pending' AND attempts = 0 AND task_path = %s
RETURNING {{task_columns}}

-- name: refresh_waiting_capped
-- refresh_waiting with a max_delay after the delay: capped at created_at + max_delay (min() of
-- two datetimes, which are text in one format here).
UPDATE django_taskclaim_task
SET payload = %s, payload_fingerprint = %s,
    run_after = min((strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s) || '000'),
                    (strftime('%%Y-%%m-%%d %%H:%%M:%%f', created_at, %s) || '000')),
    updated_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
WHERE id = %s AND status = 'pending' AND attempts = 0 AND task_path = %s
RETURNING {{task_columns}}

-- name: insert_waiting
-- A coalesced task, pending (the parameters of postgresql.sql's). Its row.
{{task_insert}}
VALUES (%s, %s, 'pending', '', 0, 0, %s, NULL, %s, %s, NULL, '', '', %s,
    (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000'), (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000'),
    %s, %s, (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s) || '000'), %s)
RETURNING {{task_columns}}

-- name: requeue
-- A reclaimed task's new dispatch (JSON; task id, the token it was reclaimed with), if it is still
-- pending under that token: the sweeper re-sends it.
UPDATE django_taskclaim_task SET dispatch = %s, updated_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
WHERE id = %s AND status = 'pending' AND fencing_token = %s

-- name: requeue_stale
-- requeue for a pending task not touched for a while (JSON; task id; '-30.000 seconds').
UPDATE django_taskclaim_task SET dispatch = %s, updated_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
WHERE id = %s AND status = 'pending'
  AND updated_at < (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s) || '000')

-- name: fail_exhausted
-- The claim (error, task id, token) whose lease expired with no attempts left: failed.
UPDATE django_taskclaim_task
SET status = 'failed', error = %s, lease_expires_at = NULL,
    updated_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
WHERE id = %s AND status = 'running' AND fencing_token = %s
  AND lease_expires_at < (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000') AND attempts >= max_attempts

-- name: close_expired_attempt
-- Its attempt row (task id, token), if still open: expired.
UPDATE django_taskclaim_attempt SET outcome = 'expired', ended_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
WHERE task_id = %s AND token = %s AND outcome = 'running'

-- name: close_running_attempt
-- An attempt row (outcome, task id, token) still open, closed with that outcome.
UPDATE django_taskclaim_attempt SET outcome = %s, ended_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
WHERE task_id = %s AND token = %s AND outcome = 'running'

-- name: cancel
-- Pending or running tasks (their ids) cancelled.
UPDATE django_taskclaim_task
SET status = 'cancelled', lease_expires_at = NULL, updated_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
WHERE id IN (%s, ...) AND status IN ('pending', 'running')

-- name: close_cancelled_attempts
-- The open attempt rows of those tasks (the same ids) that cancel did cancel.
UPDATE django_taskclaim_attempt SET outcome = 'cancelled', ended_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
WHERE task_id IN (%s, ...) AND outcome = 'running'
  AND task_id IN (SELECT id FROM django_taskclaim_task WHERE status = 'cancelled')

-- name: reset
-- Failed or cancelled tasks (their ids) pending again, as never run.
UPDATE django_taskclaim_task
SET status = 'pending', attempts = 0, owner = '', error = '', lease_expires_at = NULL,
    updated_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
WHERE id IN (%s, ...) AND status IN ('failed', 'cancelled')

-- name: begin_write
-- A write that matches nothing, as a transaction's first statement: it takes the one write lock
-- now, waiting for it (the busy timeout) like any other write.
UPDATE django_taskclaim_task SET id = id WHERE 0 = 1

-- name: read_task
-- The task (tenant, key): its row, or none.
SELECT {{task_columns}}
FROM django_taskclaim_task WHERE tenant = %s AND "key" = %s

-- name: read_state
-- What a claim by key that did not claim met (tenant, key): the task's row, and whether its lease
-- has expired.
SELECT {{task_columns}},
    (lease_expires_at < (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000'))
FROM django_taskclaim_task WHERE tenant = %s AND "key" = %s

-- name: ensure
-- A new pending task unless its (tenant, key) exists (the parameters of postgresql.sql's): its
-- row, or none.
{{task_insert}}
VALUES (%s, %s, 'pending', '', 0, 0, %s, NULL, %s, %s, NULL, '', '', %s,
    (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000'), (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000'),
    %s, %s, %s, %s)
ON CONFLICT (tenant, "key") DO NOTHING
RETURNING {{task_columns}}

-- name: claim_key
-- A claim by key (tenant, key, owner, max_attempts, lease as '+60.000 seconds', payload, fingerprint):
-- a new running task, or the existing one taken over where it is claimable (pending, or running
-- with an expired lease and attempts left; never a queued task) and its payload fits (none given,
-- none stored, or the same). SQLite re-checks the WHERE on the row it writes: one of several racing
-- claims matches. A task first named without a payload keeps the first payload a claim brings.
-- The row, or none when the task was not claimable.
{{task_insert}}
VALUES (%s, %s, 'running', %s, {{epoch_floor}} + 1, 1, %s, (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s) || '000'), %s, %s,
    NULL, '', '', NULL,
    (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000'), (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000'),
    NULL, 0, NULL, '')
ON CONFLICT (tenant, "key") DO UPDATE
SET status = 'running', owner = excluded.owner, fencing_token = {{next_token}},
    attempts = django_taskclaim_task.attempts + 1, lease_expires_at = excluded.lease_expires_at,
    updated_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000'),
    payload = CASE WHEN django_taskclaim_task.payload_fingerprint = '' THEN excluded.payload
                   ELSE django_taskclaim_task.payload END,
    payload_fingerprint = CASE WHEN django_taskclaim_task.payload_fingerprint = '' THEN excluded.payload_fingerprint
                               ELSE django_taskclaim_task.payload_fingerprint END
WHERE ((django_taskclaim_task.status = 'pending'
        OR (django_taskclaim_task.status = 'running'
            AND django_taskclaim_task.lease_expires_at < (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
            AND django_taskclaim_task.attempts < django_taskclaim_task.max_attempts))
       AND django_taskclaim_task.queue IS NULL)
  AND (excluded.payload_fingerprint = '' OR django_taskclaim_task.payload_fingerprint IN ('', excluded.payload_fingerprint))
RETURNING {{task_columns}}

-- name: take_over_attempt
-- Close the attempt a claim took over (task id, the claim's token: the attempt's is lower, the one
-- before or the last of an earlier epoch), if still open: its owner.
UPDATE django_taskclaim_attempt
SET outcome = 'taken_over', ended_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
WHERE task_id = %s AND token < %s AND outcome = 'running'
RETURNING owner

-- name: insert_attempt
-- The attempt row of a claim that starts now (task id, token, owner, delivery id).
INSERT INTO django_taskclaim_attempt (task_id, token, owner, delivery_id, started_at, ended_at, outcome,
    stale_writes, error, error_class, traceback)
VALUES (%s, %s, %s, %s, (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000'), NULL, 'running', 0, '', '', '')

-- name: record_duplicate
-- The audit row of a duplicate delivery (owner, delivery id, task id), inserted only while the task
-- row exists: a purge that deleted the task since it was read makes this insert nothing instead of
-- violating the foreign key.
INSERT INTO django_taskclaim_attempt (task_id, token, owner, delivery_id, started_at, ended_at, outcome,
    stale_writes, error, error_class, traceback)
SELECT id, NULL, %s, %s, (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000'),
    (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000'), 'duplicate', 0, '', '', ''
FROM django_taskclaim_task WHERE id = %s

-- name: unstart
-- Claims this transaction just made, not started after all (the reservation as '+5.000 seconds';
-- their ids): the attempt uncounted, the lease a reservation. Each one's new expiry.
UPDATE django_taskclaim_task
SET attempts = attempts - 1, lease_expires_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s) || '000')
WHERE id IN (%s, ...)
RETURNING id, lease_expires_at

-- name: complete
-- The claim's task (result JSON, result_ref; task id, token) succeeded, if the claim still holds
-- it: its status, or no row when fenced off.
UPDATE django_taskclaim_task
SET status = 'succeeded', result = %s, result_ref = %s, error = '', lease_expires_at = NULL,
    updated_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
WHERE id = %s AND status = 'running' AND fencing_token = %s
RETURNING status

-- name: fail
-- The claim's task (retry, retry, error, retry, backoff as '+5.000 seconds' or NULL; task id, token)
-- failed: pending again when retried with attempts left ("not before" now + backoff, if any), else
-- failed. Its status, or no row when fenced off.
UPDATE django_taskclaim_task
SET status = CASE WHEN %s AND attempts < max_attempts THEN 'pending' ELSE 'failed' END,
    owner = CASE WHEN %s AND attempts < max_attempts THEN '' ELSE owner END,
    error = %s,
    run_after = CASE WHEN %s AND attempts < max_attempts
                     THEN COALESCE((strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s) || '000'), run_after)
                     ELSE run_after END,
    lease_expires_at = NULL, updated_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
WHERE id = %s AND status = 'running' AND fencing_token = %s
RETURNING status

-- name: release
-- The claim's task (delay as '+5.000 seconds' or NULL, reason or NULL; task id, token) pending
-- again, untouched: this attempt does not count. Not claimed again before the delay is over; the
-- reason kept as its error. Owners and operators (force_release) release alike.
UPDATE django_taskclaim_task
SET status = 'pending', owner = '', attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END,
    run_after = COALESCE((strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s) || '000'), run_after),
    error = COALESCE(%s, error),
    lease_expires_at = NULL, updated_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
WHERE id = %s AND status = 'running' AND fencing_token = %s
RETURNING status

-- name: unreserve
-- A reserved claim (task id, token), never started, given back: pending, its attempt count unchanged.
UPDATE django_taskclaim_task
SET status = 'pending', owner = '', lease_expires_at = NULL,
    updated_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
WHERE id = %s AND status = 'running' AND fencing_token = %s
RETURNING status

-- name: close_attempt
-- The attempt row of an ending claim (outcome; task id, token).
UPDATE django_taskclaim_attempt
SET outcome = %s, ended_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
WHERE task_id = %s AND token = %s

-- name: close_failed_attempt
-- The attempt row of a failed claim (outcome, error, error class, traceback; task id, token).
UPDATE django_taskclaim_attempt
SET outcome = %s, ended_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000'),
    error = %s, error_class = %s, traceback = %s
WHERE task_id = %s AND token = %s

-- name: reclaim
-- Expired claims (at most a number of them, oldest id first; NULL: all, as LIMIT -1) moved on:
-- pending again with attempts left, else failed ("lease expired with no attempts left"). The owner
-- is cleared with the lease (the attempt log keeps who held it). Each task moved (id, key, tenant,
-- token, new status).
UPDATE django_taskclaim_task
SET status = CASE WHEN attempts < max_attempts THEN 'pending' ELSE 'failed' END,
    owner = CASE WHEN attempts < max_attempts THEN '' ELSE owner END,
    error = CASE WHEN attempts < max_attempts THEN error ELSE 'lease expired with no attempts left' END,
    lease_expires_at = NULL, updated_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
WHERE id IN (SELECT id FROM django_taskclaim_task
             WHERE status = 'running' AND lease_expires_at < (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
             ORDER BY id LIMIT COALESCE(%s, -1))
  AND status = 'running' AND lease_expires_at < (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
RETURNING id, "key", tenant, fencing_token, status

-- name: force_release
-- Claims (each one's id and token) released by an operator, as their owners release (see release):
-- pending, this attempt not counted. Each task moved.
UPDATE django_taskclaim_task
SET status = 'pending', owner = '', attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END,
    lease_expires_at = NULL, updated_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
WHERE status = 'running' AND ((id = %s AND fencing_token = %s) OR ...)
RETURNING id, "key", tenant, fencing_token, status

-- name: ensure_many
-- New pending tasks unless their (tenant, key) exists (each task's values as ensure's, a row
-- each): of each row inserted, id, tenant, key, created_at, payload.
{{task_insert}}
VALUES (%s, %s, 'pending', '', 0, 0, %s, NULL, %s, %s, NULL, '', '', %s,
    (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000'), (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000'),
    %s, %s, %s, %s), ...
ON CONFLICT (tenant, "key") DO NOTHING
RETURNING id, tenant, "key", created_at, payload

-- name: read_tasks
-- The tasks (each one's tenant and key), those that exist.
SELECT {{task_columns}}
FROM django_taskclaim_task WHERE (tenant, "key") IN ((%s, %s), ...)

-- name: fail_exhausted_queued
-- The queued tasks ({{queue_filter}}) whose lease expired on their last attempt, made failed as
-- reclaim would: a queue worker takes over what it can, and strands nothing it cannot.
UPDATE django_taskclaim_task SET status = 'failed', error = 'lease expired with no attempts left',
    lease_expires_at = NULL, updated_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
WHERE django_taskclaim_task.status = 'running'
    AND django_taskclaim_task.lease_expires_at < (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
    AND django_taskclaim_task.attempts >= django_taskclaim_task.max_attempts AND {{queue_filter}}
RETURNING id, "key", tenant, fencing_token, status

-- name: queue_claim
-- The queue claim (owner, lease as '+60.000 seconds', {{queue_filter}}'s, limit), after
-- fail_exhausted_queued in the same transaction: expired leases first (older work), then the due
-- pending tasks, the highest priority first, of keys with room ({{has_room}}); of each key's pending
-- candidates, those that fit: the key's running tasks plus the candidate's place among them within
-- its limit (sql.fits). SQLite's one writer makes the counts exact: this transaction holds the write
-- lock since fail_exhausted_queued. The UPDATE re-checks the claim predicate.
UPDATE django_taskclaim_task SET status = 'running', owner = %s,
    fencing_token = {{next_token}}, attempts = django_taskclaim_task.attempts + 1,
    lease_expires_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s) || '000'),
    updated_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
WHERE id IN (
    SELECT id FROM (
        SELECT c.*, row_number() OVER (PARTITION BY c.ck, c.pending ORDER BY c.priority DESC, c.id) AS place
        FROM (
            SELECT id, priority, concurrency_key AS ck, concurrency_limit AS cl, status = 'pending' AS pending
            FROM django_taskclaim_task
            WHERE ((django_taskclaim_task.status = 'pending' AND (django_taskclaim_task.run_after IS NULL
                    OR django_taskclaim_task.run_after <= (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')))
                OR (django_taskclaim_task.status = 'running'
                    AND django_taskclaim_task.lease_expires_at < (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
                    AND django_taskclaim_task.attempts < django_taskclaim_task.max_attempts))
            AND {{queue_filter}} AND {{has_room}}
            ORDER BY django_taskclaim_task.status = 'pending', django_taskclaim_task.priority DESC,
                django_taskclaim_task.id
            LIMIT %s) c) w
    WHERE w.ck = '' OR NOT w.pending
        OR (SELECT count(*) FROM django_taskclaim_task r WHERE r.concurrency_key = w.ck AND r.status = 'running')
            + w.place <= w.cl)
AND (django_taskclaim_task.status = 'pending' OR (django_taskclaim_task.status = 'running'
    AND django_taskclaim_task.lease_expires_at < (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
    AND django_taskclaim_task.attempts < django_taskclaim_task.max_attempts))
RETURNING {{task_columns}}

-- name: epoch_bump
-- One more epoch (the last epoch): above the stored one and above the epoch of every token in the
-- table, so a bump lost with a failed primary is made good where any token of its epoch reached this
-- one (a scan of the task table: a bump is rare). No row: at the last epoch.
UPDATE django_taskclaim_epoch
SET bumps = max(bumps, COALESCE((SELECT MAX(t.fencing_token) FROM django_taskclaim_task t), 0) >> 32) + 1,
    bumped_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
WHERE id = 1 AND max(bumps, COALESCE((SELECT MAX(t.fencing_token) FROM django_taskclaim_task t), 0) >> 32) < %s

-- name: next_token
-- A part: common.sql's next_token, with SQLite's scalar max(); past the last token of its epoch it is
-- NULL, which the column refuses (NOT NULL constraint failed: django_taskclaim_task.fencing_token):
-- migration 0013 adds no constraint here, since SQLite adds one by making the table anew.
CASE WHEN (max(fencing_token, {{epoch_floor}}) & 4294967295) <> 4294967295
    THEN max(fencing_token, {{epoch_floor}}) + 1 END

-- name: store_step
-- A step's result stored under its task (name, JSON, task id, token) while the claim (task id, token)
-- holds the task, in one statement under SQLite's one write lock: nothing when it was fenced off, nor
-- when a step of that name is stored already (the first stored result stands).
INSERT INTO django_taskclaim_step (task_id, name, result, token, created_at)
SELECT id, %s, %s, fencing_token, (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
FROM django_taskclaim_task WHERE id = %s AND status = 'running' AND fencing_token = %s
ON CONFLICT (task_id, name) DO NOTHING
