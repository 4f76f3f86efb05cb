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

-- name: task_columns
-- A part: a task row's columns in TASK_COLUMNS order, as decode() reads them.
`id`, `tenant`, `key`, `status`, `owner`, `fencing_token`, `attempts`, `max_attempts`,
`lease_expires_at`, `payload`, `payload_fingerprint`, `result`, `result_ref`, `error`, `dispatch`,
`created_at`, `updated_at`, `queue`, `priority`, `run_after`, `task_path`

-- name: task_insert
-- A part: the insert of a task's row, its columns but id named (in TASK_COLUMNS order).
INSERT INTO django_taskclaim_task (`tenant`, `key`, `status`, `owner`, `fencing_token`, `attempts`,
    `max_attempts`, `lease_expires_at`, `payload`, `payload_fingerprint`, `result`, `result_ref`, `error`,
    `dispatch`, `created_at`, `updated_at`, `queue`, `priority`, `run_after`, `task_path`)

-- name: claimed_columns_audited
-- A part: a claimed task's row (t) and the owner of the attempt it took over (the
-- attempt below its token, still running: the one before, or the last of an earlier epoch), read in
-- the claim's transaction.
t.`id`, t.`tenant`, t.`key`, t.`status`, t.`owner`, t.`fencing_token`, t.`attempts`, t.`max_attempts`,
t.`lease_expires_at`, t.`payload`, t.`payload_fingerprint`, t.`result`, t.`result_ref`, t.`error`,
t.`dispatch`, t.`created_at`, t.`updated_at`, t.`queue`, t.`priority`, t.`run_after`, t.`task_path`,
(SELECT a.owner FROM django_taskclaim_attempt a
 WHERE a.task_id = t.id AND a.token < t.fencing_token AND a.outcome = 'running' ORDER BY a.token DESC LIMIT 1)

-- name: refresh_waiting
-- A coalescing group's latest task takes the newest arguments (payload, fingerprint, delay in
-- microseconds, task id, task path) if it still waits (see postgresql.sql). InnoDB re-checks the
-- WHERE on the latest committed version of the row it locks; the row count says whether it did.
UPDATE django_taskclaim_task
SET payload = %s, payload_fingerprint = %s, run_after = TIMESTAMPADD(MICROSECOND, %s, UTC_TIMESTAMP(6)),
    updated_at = UTC_TIMESTAMP(6)
WHERE id = %s AND status = 'pending' AND attempts = 0 AND task_path = %s

-- name: refresh_waiting_capped
-- refresh_waiting with a max_delay (microseconds, after the delay): capped at created_at + max_delay.
UPDATE django_taskclaim_task
SET payload = %s, payload_fingerprint = %s,
    run_after = LEAST(TIMESTAMPADD(MICROSECOND, %s, UTC_TIMESTAMP(6)), TIMESTAMPADD(MICROSECOND, %s, created_at)),
    updated_at = UTC_TIMESTAMP(6)
WHERE id = %s AND status = 'pending' AND attempts = 0 AND task_path = %s

-- name: insert_waiting
-- A coalesced task, pending (the parameters of postgresql.sql's, the delay in microseconds).
{{task_insert}}
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
SELECT {{task_columns}}
FROM django_taskclaim_task WHERE tenant = %s AND `key` = %s

-- name: read_state
-- What a claim by key that did not claim met (tenant, key): the task's row, and whether its lease
-- has expired.
SELECT {{task_columns}},
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

-- name: claim_existing
-- Take the task (owner, lease in microseconds, payload, fingerprint, tenant, key, fingerprint
-- twice) where it is claimable (pending, or running with an expired lease and attempts left; never
-- a queued task) and its payload fits. InnoDB re-checks the WHERE on the latest committed version
-- of the row it locks; the row count says whether it matched, and the row is this transaction's
-- until it commits. A task first named without a payload keeps the first payload a claim brings
-- (the payload columns are set before the fingerprint: MySQL assigns left to right).
UPDATE django_taskclaim_task
SET status = 'running', owner = %s, fencing_token = {{next_token}},
    attempts = django_taskclaim_task.attempts + 1,
    lease_expires_at = TIMESTAMPADD(MICROSECOND, %s, UTC_TIMESTAMP(6)), updated_at = UTC_TIMESTAMP(6),
    payload = CASE WHEN django_taskclaim_task.payload_fingerprint = '' THEN %s ELSE django_taskclaim_task.payload END,
    payload_fingerprint = CASE WHEN django_taskclaim_task.payload_fingerprint = '' THEN %s
                               ELSE django_taskclaim_task.payload_fingerprint END
WHERE tenant = %s AND `key` = %s
  AND ((django_taskclaim_task.status = 'pending'
        OR (django_taskclaim_task.status = 'running' AND django_taskclaim_task.lease_expires_at < UTC_TIMESTAMP(6)
            AND django_taskclaim_task.attempts < django_taskclaim_task.max_attempts))
       AND django_taskclaim_task.queue IS NULL)
  AND (%s = '' OR django_taskclaim_task.payload_fingerprint IN ('', %s))

-- name: insert_claimed
-- A claim by key of a key with no task yet (tenant, key, owner, max_attempts, lease in
-- microseconds, payload, fingerprint): a new running task. A duplicate key is refused (error 1062).
{{task_insert}}
VALUES (%s, %s, 'running', %s, {{epoch_floor}} + 1, 1, %s, TIMESTAMPADD(MICROSECOND, %s, UTC_TIMESTAMP(6)), %s, %s, NULL, '', '',
    NULL, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), NULL, 0, NULL, '')

-- name: close_taken_over_attempt
-- Close the attempt a claim took over (task id, the claim's token: the attempt's is lower, the one
-- before or the last of an earlier epoch), if still open.
UPDATE django_taskclaim_attempt SET outcome = 'taken_over', ended_at = UTC_TIMESTAMP(6)
WHERE task_id = %s AND token < %s AND outcome = 'running'

-- name: insert_attempt
-- The attempt row of a claim that starts now (task id, token, owner, delivery id).
INSERT INTO django_taskclaim_attempt (task_id, token, owner, delivery_id, started_at, ended_at, outcome,
    stale_writes, error, error_class, traceback)
VALUES (%s, %s, %s, %s, UTC_TIMESTAMP(6), NULL, 'running', 0, '', '', '')

-- name: record_duplicate
-- The audit row of a duplicate delivery (owner, delivery id, task id), inserted only while the task
-- row exists, and only if it can be share-locked at once (MySQL has no WAIT n): a row held by its
-- owner's fenced() is skipped, and the row left out. The task row is share-locked first, then the
-- attempt row inserted: the order a purge takes them in.
INSERT INTO django_taskclaim_attempt (task_id, token, owner, delivery_id, started_at, ended_at, outcome,
    stale_writes, error, error_class, traceback)
SELECT id, NULL, %s, %s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), 'duplicate', 0, '', '', ''
FROM django_taskclaim_task WHERE id = %s FOR SHARE SKIP LOCKED

-- name: record_duplicate_waiting
-- record_duplicate on MariaDB (owner, delivery id, task id, whole seconds to wait for the share
-- lock): error 1205 when the row stays held longer.
INSERT INTO django_taskclaim_attempt (task_id, token, owner, delivery_id, started_at, ended_at, outcome,
    stale_writes, error, error_class, traceback)
SELECT id, NULL, %s, %s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), 'duplicate', 0, '', '', ''
FROM django_taskclaim_task WHERE id = %s LOCK IN SHARE MODE WAIT %s

-- name: task_exists
-- Whether the task (id) exists.
SELECT 1 FROM django_taskclaim_task WHERE id = %s

-- name: unstart
-- Claims this transaction just made, not started after all (the reservation in microseconds; their
-- ids): the attempt uncounted, the lease a reservation. read_leases reads the new expiries.
UPDATE django_taskclaim_task
SET attempts = attempts - 1, lease_expires_at = TIMESTAMPADD(MICROSECOND, %s, UTC_TIMESTAMP(6))
WHERE id IN (%s, ...)

-- name: read_leases
-- The tasks' (their ids) lease expiries, as this transaction left them.
SELECT id, lease_expires_at FROM django_taskclaim_task WHERE id IN (%s, ...)

-- name: complete
-- The claim's task (result JSON, result_ref; task id, token) succeeded, if the claim still holds
-- it. No RETURNING: the row count says whether it did.
UPDATE django_taskclaim_task
SET status = 'succeeded', result = %s, result_ref = %s, error = '', lease_expires_at = NULL,
    updated_at = UTC_TIMESTAMP(6)
WHERE id = %s AND status = 'running' AND fencing_token = %s

-- name: fail
-- The claim's task (retry, retry, error, retry, backoff in microseconds or NULL; task id, token)
-- failed: pending again when retried with attempts left ("not before" now + backoff, if any), else
-- failed. status_of reads which.
UPDATE django_taskclaim_task
SET status = CASE WHEN %s AND attempts < max_attempts THEN 'pending' ELSE 'failed' END,
    owner = CASE WHEN %s AND attempts < max_attempts THEN '' ELSE owner END,
    error = %s,
    run_after = CASE WHEN %s AND attempts < max_attempts
                     THEN COALESCE(TIMESTAMPADD(MICROSECOND, %s, UTC_TIMESTAMP(6)), run_after)
                     ELSE run_after END,
    lease_expires_at = NULL, updated_at = UTC_TIMESTAMP(6)
WHERE id = %s AND status = 'running' AND fencing_token = %s

-- name: release
-- The claim's task (delay in microseconds or NULL, reason or NULL; task id, token) pending again,
-- untouched: this attempt does not count. Not claimed again before the delay is over; the reason
-- kept as its error.
UPDATE django_taskclaim_task
SET status = 'pending', owner = '', attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END,
    run_after = COALESCE(TIMESTAMPADD(MICROSECOND, %s, UTC_TIMESTAMP(6)), run_after),
    error = COALESCE(%s, error),
    lease_expires_at = NULL, updated_at = UTC_TIMESTAMP(6)
WHERE id = %s AND status = 'running' AND fencing_token = %s

-- name: unreserve
-- A reserved claim (task id, token), never started, given back: pending, its attempt count unchanged.
UPDATE django_taskclaim_task
SET status = 'pending', owner = '', lease_expires_at = NULL, updated_at = UTC_TIMESTAMP(6)
WHERE id = %s AND status = 'running' AND fencing_token = %s

-- name: status_of
-- The status of a task (id) this transaction just moved on.
SELECT status FROM django_taskclaim_task WHERE id = %s

-- name: close_attempt
-- The attempt row of an ending claim (outcome; task id, token).
UPDATE django_taskclaim_attempt SET outcome = %s, ended_at = UTC_TIMESTAMP(6)
WHERE task_id = %s AND token = %s

-- name: close_failed_attempt
-- The attempt row of a failed claim (outcome, error, error class, traceback; task id, token).
UPDATE django_taskclaim_attempt
SET outcome = %s, ended_at = UTC_TIMESTAMP(6), error = %s, error_class = %s, traceback = %s
WHERE task_id = %s AND token = %s

-- name: rows_by_id
-- The tasks (their ids), in id order.
SELECT {{task_columns}}
FROM django_taskclaim_task WHERE id IN (%s, ...) ORDER BY id

-- name: claimed_rows_audited
-- The tasks this transaction just claimed (their ids), in id order, each with the owner of the
-- attempt it took over (read in the same statement: one round trip less per takeover).
SELECT {{claimed_columns_audited}}
FROM django_taskclaim_task t WHERE t.id IN (%s, ...) ORDER BY t.id

-- name: claimed_by_key_audited
-- The task this transaction just claimed by key (tenant, key), with the owner of the attempt it
-- took over.
SELECT {{claimed_columns_audited}}
FROM django_taskclaim_task t WHERE t.tenant = %s AND t.`key` = %s

-- name: ensure
-- A new pending task (tenant, key, max_attempts, payload, fingerprint, dispatch, queue, priority,
-- run_after, task path). A duplicate key is refused (error 1062): the task exists.
{{task_insert}}
VALUES (%s, %s, 'pending', '', 0, 0, %s, NULL, %s, %s, NULL, '', '', %s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6),
    %s, %s, %s, %s)

-- name: ensure_many
-- New pending tasks (each task's values as ensure's, a row each). One duplicate key refuses them
-- all (error 1062: InnoDB undoes this statement alone), and ensure inserts them one at a time.
{{task_insert}}
VALUES (%s, %s, 'pending', '', 0, 0, %s, NULL, %s, %s, NULL, '', '', %s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6),
    %s, %s, %s, %s), ...

-- name: read_tasks
-- The tasks (each one's tenant and key), those that exist.
SELECT {{task_columns}}
FROM django_taskclaim_task WHERE (tenant, `key`) IN ((%s, %s), ...)

-- name: fail_exhausted_locked
-- Expired tasks on their last attempt that this transaction locked (the error; their ids): failed,
-- as reclaim would end them.
UPDATE django_taskclaim_task
SET status = 'failed', error = %s, lease_expires_at = NULL, updated_at = UTC_TIMESTAMP(6)
WHERE id IN (%s, ...) AND status = 'running'

-- -- the sweeper and operators: each locks its rows first, by primary key in id order ----------
-- Operators lock task rows through the primary key, as owners do (by id). Through the (status, id)
-- index (the optimizer's pick for "status IN (...) AND id IN (...)") an operator would hold a row's
-- index entry while waiting for the row, and an owner completing that row (which moves its
-- (status, id) entry) would wait for the entry: a deadlock. Hence FORCE INDEX (PRIMARY).

-- name: lock_expired
-- Lock expired claims (at most a number of them, oldest id first; all of them:
-- 18446744073709551615, MySQL's way to say no limit): their ids. SKIP LOCKED: a claim a
-- transaction holds is left to the next sweep.
SELECT id FROM django_taskclaim_task
WHERE status = 'running' AND lease_expires_at < UTC_TIMESTAMP(6)
ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED

-- name: reclaim
-- The expired claims lock_expired locked (their ids) moved on: pending again with attempts left,
-- else failed ("lease expired with no attempts left"). The owner is cleared with the lease (the
-- attempt log keeps who held it). MySQL assigns left to right: status first, read by nothing after.
UPDATE django_taskclaim_task
SET status = CASE WHEN attempts < max_attempts THEN 'pending' ELSE 'failed' END,
    owner = CASE WHEN attempts < max_attempts THEN '' ELSE owner END,
    error = CASE WHEN attempts < max_attempts THEN error ELSE 'lease expired with no attempts left' END,
    lease_expires_at = NULL, updated_at = UTC_TIMESTAMP(6)
WHERE id IN (%s, ...) AND status = 'running' AND lease_expires_at < UTC_TIMESTAMP(6)

-- name: lock_held
-- Of claims (each one's id and token), lock those still running: their ids.
SELECT id FROM django_taskclaim_task FORCE INDEX (PRIMARY)
WHERE status = 'running' AND ((id = %s AND fencing_token = %s) OR ...)
ORDER BY id FOR UPDATE

-- name: force_release
-- The claims lock_held locked (their ids) released by an operator, as their owners release (see
-- release): pending, this attempt not counted.
UPDATE django_taskclaim_task FORCE INDEX (PRIMARY)
SET status = 'pending', owner = '', attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END,
    lease_expires_at = NULL, updated_at = UTC_TIMESTAMP(6)
WHERE id IN (%s, ...) AND status = 'running'

-- name: existing_ids
-- Of the tasks (their ids), those that exist.
SELECT id FROM django_taskclaim_task WHERE id IN (%s, ...)

-- name: free_ids
-- Of the tasks (their ids), those a locking read can take at once (in autocommit: the locks end
-- with the statement).
SELECT id FROM django_taskclaim_task FORCE INDEX (PRIMARY) WHERE id IN (%s, ...) FOR UPDATE SKIP LOCKED

-- name: purge_candidates
-- Finished tasks to purge (statuses; updated before a datetime; at most a number), oldest id first,
-- read without locks: their tenants and keys.
SELECT tenant, `key` FROM django_taskclaim_task WHERE status IN (%s, ...) AND updated_at < %s
ORDER BY id LIMIT %s

-- name: purge_lock
-- The candidates (each one's tenant and key; the statuses, comma-separated; the datetime) locked
-- through the unique (tenant, key) index, then their rows, and checked again under the lock: the
-- order a claim by key takes them in (locked through the primary key first, a purge would deadlock
-- with a claim of a key it deletes). Their ids.
SELECT id FROM django_taskclaim_task FORCE INDEX (taskclaim_task_tenant_key_uniq)
WHERE ((tenant = %s AND `key` = %s) OR ...) AND FIND_IN_SET(status, %s) > 0 AND updated_at < %s
FOR UPDATE

-- The queue claim: three statements in one transaction (mysql.py's claim_next).

-- name: lock_expired_queued
-- The queued tasks ({{queue_filter}}) whose lease expired, oldest first (limit), locked for the
-- claim: whether each has attempts left. SKIP LOCKED so that workers never queue behind each other.
SELECT id, attempts < max_attempts FROM django_taskclaim_task
WHERE status = 'running' AND lease_expires_at < UTC_TIMESTAMP(6) AND {{queue_filter}}
ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED

-- name: lock_pending_queued
-- Then the due pending tasks (limit), the highest priority first, of keys with room ({{has_room}}):
-- each one's concurrency key and limit, for _within_limits.
SELECT id, concurrency_key, concurrency_limit FROM django_taskclaim_task
WHERE status = 'pending' AND {{queue_filter}} AND (run_after IS NULL OR run_after <= UTC_TIMESTAMP(6))
AND {{has_room}}
ORDER BY priority DESC, id LIMIT %s FOR UPDATE SKIP LOCKED

-- name: claim_queued
-- The locked tasks claimed (owner, lease in microseconds, their ids), re-checking the claim predicate.
UPDATE django_taskclaim_task SET status = 'running', owner = %s,
    fencing_token = {{next_token}}, attempts = django_taskclaim_task.attempts + 1,
    lease_expires_at = TIMESTAMPADD(MICROSECOND, %s, UTC_TIMESTAMP(6)), updated_at = UTC_TIMESTAMP(6)
WHERE id IN (%s, ...) AND (django_taskclaim_task.status = 'pending' OR (django_taskclaim_task.status = 'running'
    AND django_taskclaim_task.lease_expires_at < UTC_TIMESTAMP(6)
    AND django_taskclaim_task.attempts < django_taskclaim_task.max_attempts))

-- name: epoch_bump
-- One more epoch (the last epoch): above the stored one and above the epoch of every token in the
-- table, so a bump lost with a failed primary is made good where any token of its epoch reached this
-- one (a scan of the task table: a bump is rare). No row: at the last epoch.
UPDATE django_taskclaim_epoch
SET bumps = GREATEST(bumps, COALESCE((SELECT MAX(t.fencing_token) FROM django_taskclaim_task t), 0) >> 32) + 1,
    bumped_at = UTC_TIMESTAMP(6)
WHERE id = 1 AND GREATEST(bumps, COALESCE((SELECT MAX(t.fencing_token) FROM django_taskclaim_task t), 0) >> 32) < %s

-- name: store_step
-- A step's result stored under its task (name, JSON, task id, token) while the claim (task id, token)
-- holds the task: nothing when it was fenced off, nor when a step of that name is stored already
-- (IGNORE: the row count says 0; the name's length and the JSON are checked before). LOCK IN SHARE
-- MODE: under READ COMMITTED an INSERT … SELECT reads a snapshot, and a takeover committed meanwhile
-- would go unseen; the locking read waits for it and reads the row it committed.
INSERT IGNORE INTO django_taskclaim_step (task_id, name, result, token, created_at)
SELECT id, %s, %s, fencing_token, UTC_TIMESTAMP(6)
FROM django_taskclaim_task WHERE id = %s AND status = 'running' AND fencing_token = %s
LOCK IN SHARE MODE
