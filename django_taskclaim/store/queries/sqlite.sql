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
