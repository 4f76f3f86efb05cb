-- The statements every database runs as written. A vendor's file (postgresql.sql, mysql.sql,
-- sqlite.sql) holds a statement of the same name where its SQL differs. Parameters: %s, in order.
-- Rules: store/queries/__init__.py.

-- name: check
-- Whether the claim (id, token) still holds its task: running, and no one claimed it since.
SELECT 1 FROM django_taskclaim_task
WHERE id = %s AND status = 'running' AND fencing_token = %s

-- name: lock
-- Hold the claimed task's row until the transaction ends (fenced()), if the claim (id, token)
-- still holds it. A write that changes nothing: SQLite has no row locks, and its first write
-- takes the database's one write lock now (waiting for busy_timeout).
UPDATE django_taskclaim_task SET fencing_token = fencing_token
WHERE id = %s AND status = 'running' AND fencing_token = %s

-- name: row_free
-- The task's fencing token (id), where nothing holds its row; no row at all when it is gone.
-- Without row locks the lifecycle consults the claim's own record of holding the row.
SELECT fencing_token FROM django_taskclaim_task WHERE id = %s

-- name: record_stale
-- Count a write refused to a fenced-off claim (task id, token) on its attempt row.
UPDATE django_taskclaim_attempt SET stale_writes = stale_writes + 1
WHERE task_id = %s AND token = %s

-- name: adopt_payload
-- A task first named without a payload keeps the first payload a claim brings (payload,
-- fingerprint, task id).
UPDATE django_taskclaim_task SET payload = %s, payload_fingerprint = %s
WHERE id = %s AND payload_fingerprint = ''

-- name: set_limit
-- A new queued task's concurrency limit (key, limit, task id), written in the transaction that
-- inserted it, so that no claim sees the task without its limit.
UPDATE django_taskclaim_task SET concurrency_key = %s, concurrency_limit = %s WHERE id = %s

-- name: lock_group
-- A coalescing group's row (tenant, name), created unless it exists and locked to the end of the
-- transaction either way (the no-op update locks a row that was there): its latest task's id.
INSERT INTO django_taskclaim_coalescegroup (tenant, name, task_id) VALUES (%s, %s, NULL)
ON CONFLICT (tenant, name) DO UPDATE SET task_id = django_taskclaim_coalescegroup.task_id
RETURNING task_id

-- name: set_group_latest
-- The group's (tenant, name) latest task is now this one (task id, tenant, name).
UPDATE django_taskclaim_coalescegroup SET task_id = %s WHERE tenant = %s AND name = %s

-- name: purge_select
-- Finished tasks to purge (statuses; updated before a datetime; at most a number), oldest id first.
SELECT id FROM django_taskclaim_task WHERE status IN (%s, ...) AND updated_at < %s
ORDER BY id LIMIT %s

-- name: purge_attempts
-- The attempt rows of the tasks purge_select chose (their ids).
DELETE FROM django_taskclaim_attempt WHERE task_id IN (%s, ...)

-- name: purge_tasks
-- The tasks purge_select chose (their ids), after their attempt rows.
DELETE FROM django_taskclaim_task WHERE id IN (%s, ...)
