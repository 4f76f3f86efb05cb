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

-- The queue claim's parts where a database has no arrays (SQLite's claim, MySQL's): the vendor's
-- statements take them by {{name}}, filled by the parts the call names (SQLStore.queue_parts).

-- name: queue_filter
-- The queued tasks a queue claim looks at (the queue names; the tenant, the task a completion just
-- ended where the call names them).
django_taskclaim_task.queue IN (%s, ...) AND {{path}} {{tenant}} {{exclude}}

-- name: handler_work
-- {{path}}: work for a handler (tasks that name no callable).
django_taskclaim_task.task_path = ''

-- name: task_paths
-- Tasks that name the callable that runs them.
django_taskclaim_task.task_path <> ''

-- name: of_tenant
-- {{tenant}}: only the tenant's tasks (a tenant).
AND django_taskclaim_task.tenant = %s

-- name: not_done
-- {{exclude}}: never the task a completion just ended in this transaction (its id), expired or not.
AND django_taskclaim_task.id <> %s

-- name: has_room
-- A candidate of a queue claim: unlimited, an expired task taken over (its key's count does not
-- change), or a pending task of a key with fewer running tasks than the task's own limit. A full
-- key's tasks are passed over, not waited for: the claim takes the next task of another key. Any
-- lease counts: a holder whose lease ran out counts until it is taken over or ends failed, so a
-- paused holder that wakes up can never run beside a task that took its place. A count in the
-- statement's snapshot: the claim then keeps of each key's candidates only those that fit (sql.fits),
-- counted where no other claim of the key can interleave.
(django_taskclaim_task.concurrency_key = '' OR django_taskclaim_task.status = 'running'
 OR (SELECT count(*) FROM django_taskclaim_task r
     WHERE r.concurrency_key = django_taskclaim_task.concurrency_key AND r.status = 'running')
    < django_taskclaim_task.concurrency_limit)

-- name: epoch_floor
-- A part: the current epoch's floor (DESIGN §13; store/epochs.py: the layout and its bounds): the
-- bumps (taskclaim_epoch --bump) * 2^32; every token of an earlier epoch is at most it. PostgreSQL's
-- leads with the server's timeline.
COALESCE((SELECT e.bumps * 4294967296 FROM django_taskclaim_epoch e WHERE e.id = 1), 0)

-- name: next_token
-- A part: a claim's new token (SET fencing_token = ..., of the row it updates): one more, and at
-- least the first of the current epoch (its floor + 1), so tokens only grow. Past the last token of
-- its epoch (2^32 - 1 claims of one task in one epoch) it would be the next epoch's first: the
-- constraint taskclaim_task_token_within_its_epoch refuses it, never a wrap.
GREATEST(fencing_token, {{epoch_floor}}) + 1

-- name: epoch_read
-- The store's epoch (its one row; none counts as no bumps, as the claims count it): the timeline
-- (0: none here), the bumps, the floor (bumps * 2^32).
SELECT 0, COALESCE(MAX(bumps), 0), COALESCE(MAX(bumps), 0) * 4294967296 FROM django_taskclaim_epoch WHERE id = 1

-- name: epoch_row
-- The epoch's one row, where it is missing (migration 0013 writes it; a test database's flush deletes it).
INSERT INTO django_taskclaim_epoch (id, timeline, bumps) SELECT 1, 0, 0
WHERE NOT EXISTS (SELECT 1 FROM django_taskclaim_epoch WHERE id = 1)

-- Durable steps (claim.step): a step's result stored under its task, once, by a fenced write.

-- name: read_steps
-- A claim's first step reads the task's stored steps (task id, token): each one's name, result (JSON
-- text) and the token that stored it, only while the claim still holds the task. One row with a NULL
-- name when none is stored; no row at all when the claim was fenced off.
SELECT s.name, s.result, s.token FROM django_taskclaim_task t
LEFT JOIN django_taskclaim_step s ON s.task_id = t.id
WHERE t.id = %s AND t.status = 'running' AND t.fencing_token = %s

-- name: read_step
-- One stored step (task id, name): its result (JSON text) and the token that stored it.
SELECT result, token FROM django_taskclaim_step WHERE task_id = %s AND name = %s

-- name: purge_steps
-- The stored steps of the tasks a purge chose (their ids), before the tasks.
DELETE FROM django_taskclaim_step WHERE task_id IN (%s, ...)

-- name: set_progress
-- A claim's progress (fraction, note, the claim's token, task id, the claim's token again), written
-- only while the claim (id, token) holds its task; no row changed when it was fenced off. Changes no
-- indexed column: a HOT update on PostgreSQL.
UPDATE django_taskclaim_task SET progress = %s, progress_note = %s, progress_token = %s
WHERE id = %s AND status = 'running' AND fencing_token = %s
