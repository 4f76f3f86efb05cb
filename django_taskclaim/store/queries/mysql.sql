-- MySQL and MariaDB: only the statements whose SQL differs from common.sql, and their own.

-- name: lock
-- Exclusive, not a share lock (which would let a duplicate's audit row in meanwhile): the owner's
-- own write in the block would then have to upgrade it, and deadlock with a claim, a heartbeat
-- or an operator queued for the row.
SELECT 1 FROM django_taskclaim_task
WHERE id = %s AND status = 'running' AND fencing_token = %s
FOR UPDATE

-- name: row_free
SELECT fencing_token FROM django_taskclaim_task WHERE id = %s
FOR UPDATE SKIP LOCKED

-- name: heartbeat
-- Renew the claim's lease (microseconds, task id, token). No UPDATE … RETURNING: the row count
-- says whether the claim holds the task, and read_lease reads the new expiry.
UPDATE django_taskclaim_task
SET lease_expires_at = TIMESTAMPADD(MICROSECOND, %s, UTC_TIMESTAMP(6)), updated_at = UTC_TIMESTAMP(6)
WHERE id = %s AND status = 'running' AND fencing_token = %s

-- name: start
-- Start a reserved claim (microseconds, task id, token): its attempt counted, the full lease.
UPDATE django_taskclaim_task
SET attempts = attempts + 1, lease_expires_at = TIMESTAMPADD(MICROSECOND, %s, UTC_TIMESTAMP(6)),
    updated_at = UTC_TIMESTAMP(6)
WHERE id = %s AND status = 'running' AND fencing_token = %s

-- name: read_lease
-- The lease expiry of a claim (task id, token) that this transaction just renewed or started.
SELECT lease_expires_at FROM django_taskclaim_task
WHERE id = %s AND status = 'running' AND fencing_token = %s

-- name: bump_gate
-- Lock a concurrency key's gate row (the key) until the queue claim commits, creating it if absent:
-- a claim of the key's tasks counts the key's running tasks only after this.
INSERT INTO django_taskclaim_concurrencygate (`key`, version) VALUES (%s, 1)
ON DUPLICATE KEY UPDATE version = version + 1

-- name: running_of_key
-- The RUNNING tasks of a concurrency key (the key), whatever their lease: an expired holder counts
-- until it is taken over or ends FAILED.
SELECT count(*) FROM django_taskclaim_task WHERE concurrency_key = %s AND status = 'running'

-- name: heartbeat_many
-- Renew the leases of many claims at once (microseconds; the ids, then each claim's id and token).
-- No RETURNING: leases_renewed reads them back. The ids first: the update locks only the rows it names.
UPDATE django_taskclaim_task
SET lease_expires_at = TIMESTAMPADD(MICROSECOND, %s, UTC_TIMESTAMP(6)), updated_at = UTC_TIMESTAMP(6)
WHERE id IN (%s, ...) AND status = 'running' AND ((id = %s AND fencing_token = %s) OR ...)

-- name: leases_renewed
-- Of the claims heartbeat_many just renewed (the same parameters, without the lease), the ids
-- with their new expiry.
SELECT id, lease_expires_at FROM django_taskclaim_task
WHERE id IN (%s, ...) AND status = 'running' AND ((id = %s AND fencing_token = %s) OR ...)

-- name: lock_group
-- A coalescing group's row (tenant, name), created unless it exists: the upsert takes the row's
-- exclusive lock whether it inserted or met the row; locked_group then reads it.
INSERT INTO django_taskclaim_coalescegroup (tenant, name, task_id) VALUES (%s, %s, NULL)
ON DUPLICATE KEY UPDATE task_id = task_id

-- name: locked_group
-- The group's (tenant, name) latest task id, read under the lock lock_group took (READ COMMITTED:
-- the latest committed value).
SELECT task_id FROM django_taskclaim_coalescegroup WHERE tenant = %s AND name = %s FOR UPDATE

-- name: refresh_waiting
-- A coalescing group's latest task takes the newest arguments (payload, fingerprint, delay in
-- microseconds, task id, task path) if it still waits (see postgresql.sql). InnoDB re-checks the
-- WHERE on the latest committed version of the row it locks; the row count says whether it did.
UPDATE django_taskclaim_task
SET payload = %s, payload_fingerprint = %s, run_after = TIMESTAMPADD(MICROSECOND, %s, UTC_TIMESTAMP(6)),
    updated_at = UTC_TIMESTAMP(6)
WHERE id = %s AND status = 'pending' AND fencing_token = 0 AND task_path = %s

-- name: refresh_waiting_capped
-- refresh_waiting with a max_delay (microseconds, after the delay): capped at created_at + max_delay.
UPDATE django_taskclaim_task
SET payload = %s, payload_fingerprint = %s,
    run_after = LEAST(TIMESTAMPADD(MICROSECOND, %s, UTC_TIMESTAMP(6)), TIMESTAMPADD(MICROSECOND, %s, created_at)),
    updated_at = UTC_TIMESTAMP(6)
WHERE id = %s AND status = 'pending' AND fencing_token = 0 AND task_path = %s

-- name: insert_waiting
-- A coalesced task, pending (the parameters of postgresql.sql's, the delay in microseconds).
INSERT INTO django_taskclaim_task (`tenant`, `key`, `status`, `owner`, `fencing_token`, `attempts`,
    `max_attempts`, `lease_expires_at`, `payload`, `payload_fingerprint`, `result`, `result_ref`, `error`,
    `dispatch`, `created_at`, `updated_at`, `queue`, `priority`, `run_after`, `task_path`)
VALUES (%s, %s, 'pending', '', 0, 0, %s, NULL, %s, %s, NULL, '', '', %s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6),
    %s, %s, TIMESTAMPADD(MICROSECOND, %s, UTC_TIMESTAMP(6)), %s)

-- name: requeue
-- A reclaimed task's new dispatch (JSON; task id, the token it was reclaimed with), if it is still
-- pending under that token: the sweeper re-sends it.
UPDATE django_taskclaim_task SET dispatch = %s, updated_at = UTC_TIMESTAMP(6)
WHERE id = %s AND status = 'pending' AND fencing_token = %s

-- name: requeue_stale
-- requeue for a pending task not touched for a while (JSON; task id; microseconds, negative).
UPDATE django_taskclaim_task SET dispatch = %s, updated_at = UTC_TIMESTAMP(6)
WHERE id = %s AND status = 'pending' AND updated_at < TIMESTAMPADD(MICROSECOND, %s, UTC_TIMESTAMP(6))

-- name: fail_exhausted
-- The claim (error, task id, token) whose lease expired with no attempts left: failed.
UPDATE django_taskclaim_task
SET status = 'failed', error = %s, lease_expires_at = NULL, updated_at = UTC_TIMESTAMP(6)
WHERE id = %s AND status = 'running' AND fencing_token = %s
  AND lease_expires_at < UTC_TIMESTAMP(6) AND attempts >= max_attempts

-- name: close_expired_attempt
-- Its attempt row (task id, token), if still open: expired.
UPDATE django_taskclaim_attempt SET outcome = 'expired', ended_at = UTC_TIMESTAMP(6)
WHERE task_id = %s AND token = %s AND outcome = 'running'

-- name: close_running_attempt
-- An attempt row (outcome, task id, token) still open, closed with that outcome.
UPDATE django_taskclaim_attempt SET outcome = %s, ended_at = UTC_TIMESTAMP(6)
WHERE task_id = %s AND token = %s AND outcome = 'running'

-- name: narrow_columns
-- Text columns of the task tables (the two table names) that are not utf8mb4: check E023.
SELECT TABLE_NAME, COLUMN_NAME, CHARACTER_SET_NAME FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN (%s, %s)
  AND CHARACTER_SET_NAME IS NOT NULL AND CHARACTER_SET_NAME <> 'utf8mb4'
ORDER BY TABLE_NAME, ORDINAL_POSITION

-- name: read_task
-- The task (tenant, key): its row, or none.
SELECT `id`, `tenant`, `key`, `status`, `owner`, `fencing_token`, `attempts`, `max_attempts`,
    `lease_expires_at`, `payload`, `payload_fingerprint`, `result`, `result_ref`, `error`, `dispatch`,
    `created_at`, `updated_at`, `queue`, `priority`, `run_after`, `task_path`
FROM django_taskclaim_task WHERE tenant = %s AND `key` = %s

-- name: read_state
-- What a claim by key that did not claim met (tenant, key): the task's row, and whether its lease
-- has expired.
SELECT `id`, `tenant`, `key`, `status`, `owner`, `fencing_token`, `attempts`, `max_attempts`,
    `lease_expires_at`, `payload`, `payload_fingerprint`, `result`, `result_ref`, `error`, `dispatch`,
    `created_at`, `updated_at`, `queue`, `priority`, `run_after`, `task_path`,
    (lease_expires_at < UTC_TIMESTAMP(6))
FROM django_taskclaim_task WHERE tenant = %s AND `key` = %s

-- name: lock_cancellable
-- Of the tasks (their ids), lock those pending or running, by primary key in id order (a plan on
-- another index would lock gaps and deadlock with claims): their ids.
SELECT id FROM django_taskclaim_task FORCE INDEX (PRIMARY)
WHERE id IN (%s, ...) AND status IN ('pending', 'running') ORDER BY id FOR UPDATE

-- name: cancel
-- The tasks lock_cancellable locked (their ids), cancelled.
UPDATE django_taskclaim_task FORCE INDEX (PRIMARY)
SET status = 'cancelled', lease_expires_at = NULL, updated_at = UTC_TIMESTAMP(6)
WHERE id IN (%s, ...)

-- name: close_cancelled_attempts
-- Their open attempt rows (the same ids): cancelled.
UPDATE django_taskclaim_attempt SET outcome = 'cancelled', ended_at = UTC_TIMESTAMP(6)
WHERE task_id IN (%s, ...) AND outcome = 'running'

-- name: lock_resettable
-- Of the tasks (their ids), lock those failed or cancelled, as lock_cancellable does: their ids.
SELECT id FROM django_taskclaim_task FORCE INDEX (PRIMARY)
WHERE id IN (%s, ...) AND status IN ('failed', 'cancelled') ORDER BY id FOR UPDATE

-- name: reset
-- The tasks lock_resettable locked (their ids) pending again, as never run.
UPDATE django_taskclaim_task FORCE INDEX (PRIMARY)
SET status = 'pending', attempts = 0, owner = '', error = '', lease_expires_at = NULL,
    updated_at = UTC_TIMESTAMP(6)
WHERE id IN (%s, ...)
