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
