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
