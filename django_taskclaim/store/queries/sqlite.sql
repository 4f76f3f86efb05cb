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

-- name: refresh_waiting
-- A coalescing group's latest task takes the newest arguments (payload, fingerprint, delay as
-- '+1.000 seconds', task id, task path) if it still waits (see postgresql.sql). Its row, or none.
UPDATE django_taskclaim_task
SET payload = %s, payload_fingerprint = %s,
    run_after = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s) || '000'),
    updated_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
WHERE id = %s AND status = 'pending' AND fencing_token = 0 AND task_path = %s
RETURNING "id", "tenant", "key", "status", "owner", "fencing_token", "attempts", "max_attempts",
    "lease_expires_at", "payload", "payload_fingerprint", "result", "result_ref", "error", "dispatch",
    "created_at", "updated_at", "queue", "priority", "run_after", "task_path"

-- name: refresh_waiting_capped
-- refresh_waiting with a max_delay after the delay: capped at created_at + max_delay (min() of
-- two datetimes, which are text in one format here).
UPDATE django_taskclaim_task
SET payload = %s, payload_fingerprint = %s,
    run_after = min((strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s) || '000'),
                    (strftime('%%Y-%%m-%%d %%H:%%M:%%f', created_at, %s) || '000')),
    updated_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')
WHERE id = %s AND status = 'pending' AND fencing_token = 0 AND task_path = %s
RETURNING "id", "tenant", "key", "status", "owner", "fencing_token", "attempts", "max_attempts",
    "lease_expires_at", "payload", "payload_fingerprint", "result", "result_ref", "error", "dispatch",
    "created_at", "updated_at", "queue", "priority", "run_after", "task_path"

-- name: insert_waiting
-- A coalesced task, pending (the parameters of postgresql.sql's). Its row.
INSERT INTO django_taskclaim_task ("tenant", "key", "status", "owner", "fencing_token", "attempts",
    "max_attempts", "lease_expires_at", "payload", "payload_fingerprint", "result", "result_ref", "error",
    "dispatch", "created_at", "updated_at", "queue", "priority", "run_after", "task_path")
VALUES (%s, %s, 'pending', '', 0, 0, %s, NULL, %s, %s, NULL, '', '', %s,
    (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000'), (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000'),
    %s, %s, (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s) || '000'), %s)
RETURNING "id", "tenant", "key", "status", "owner", "fencing_token", "attempts", "max_attempts",
    "lease_expires_at", "payload", "payload_fingerprint", "result", "result_ref", "error", "dispatch",
    "created_at", "updated_at", "queue", "priority", "run_after", "task_path"

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
SELECT "id", "tenant", "key", "status", "owner", "fencing_token", "attempts", "max_attempts",
    "lease_expires_at", "payload", "payload_fingerprint", "result", "result_ref", "error", "dispatch",
    "created_at", "updated_at", "queue", "priority", "run_after", "task_path"
FROM django_taskclaim_task WHERE tenant = %s AND "key" = %s

-- name: read_state
-- What a claim by key that did not claim met (tenant, key): the task's row, and whether its lease
-- has expired.
SELECT "id", "tenant", "key", "status", "owner", "fencing_token", "attempts", "max_attempts",
    "lease_expires_at", "payload", "payload_fingerprint", "result", "result_ref", "error", "dispatch",
    "created_at", "updated_at", "queue", "priority", "run_after", "task_path",
    (lease_expires_at < (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000'))
FROM django_taskclaim_task WHERE tenant = %s AND "key" = %s

-- name: ensure
-- A new pending task unless its (tenant, key) exists (the parameters of postgresql.sql's): its
-- row, or none.
INSERT INTO django_taskclaim_task ("tenant", "key", "status", "owner", "fencing_token", "attempts",
    "max_attempts", "lease_expires_at", "payload", "payload_fingerprint", "result", "result_ref", "error",
    "dispatch", "created_at", "updated_at", "queue", "priority", "run_after", "task_path")
VALUES (%s, %s, 'pending', '', 0, 0, %s, NULL, %s, %s, NULL, '', '', %s,
    (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000'), (strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000'),
    %s, %s, %s, %s)
ON CONFLICT (tenant, "key") DO NOTHING
RETURNING "id", "tenant", "key", "status", "owner", "fencing_token", "attempts", "max_attempts",
    "lease_expires_at", "payload", "payload_fingerprint", "result", "result_ref", "error", "dispatch",
    "created_at", "updated_at", "queue", "priority", "run_after", "task_path"
