-- MariaDB and MySQL: no partial indexes and no UPDATE ... RETURNING. The claim
-- index leads with state (migration 0002), so "due" is asked as ordered range
-- scans, pending_due and expired_lease (common.sql), merged in Python
-- (mysql.py). Rows are locked by the select (FOR UPDATE SKIP LOCKED) and
-- updated by key while the locks are held; a transition reads its row's kind
-- back after the update.

-- fragment: returning_kind

-- fragment: returning_moved

-- fragment: by_id
-- With a list of ids and a test of the state, MariaDB may walk a state-led
-- index instead, locking every row of the state: claimers then deadlock.
 FORCE INDEX (PRIMARY)

-- fragment: by_target
-- Without it MariaDB looks a walked row's target up on the (kind, state)
-- index, reading every blocking row of the kind for each intent it walks: a
-- claim of 32 past 300 held targets took 50 ms instead of 5 (bench/target_health.py).
FORCE INDEX (intents_targets_kind_target)

-- fragment: prioritized_due
-- The same for priorities other than 0, on the virtual column of migration 0007.
prioritized_state = 'pending' AND next_at <= %(now)s

-- fragment: expired_floor
-- The claim floor applies to priority 0 only.
(priority <> 0 OR {floor})

-- name: clock
-- In UTC whatever the session's time_zone.
SELECT UTC_TIMESTAMP(6)

-- name: insert
-- IGNORE is safe: every value was validated before, so the only error it can
-- swallow is the duplicate key that makes enqueue idempotent.
INSERT IGNORE INTO {table} ({columns}) VALUES [rows:{column_group}] RETURNING kind

-- name: claim
-- Pending intents by priority branch (see common.sql), each a range of one
-- state-led index (with most rows of priority 0, MariaDB would rather scan the
-- table and sort), then the expired leases of every priority: the claim sorts
-- what they found and keeps its limit.
(SELECT {columns} FROM {table} FORCE INDEX (intents_prioritized_mysql_idx)
  WHERE {prioritized_due} AND priority > 0 AND {claim_filters}
  ORDER BY {claim_order} LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
UNION ALL
(SELECT {columns} FROM {table} FORCE INDEX (intents_claim_mysql_idx)
  WHERE {pending_due} AND priority = 0 AND {claim_filters} AND {floor}
  ORDER BY {order_within_priority} LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
UNION ALL
(SELECT {columns} FROM {table} FORCE INDEX (intents_prioritized_mysql_idx)
  WHERE {prioritized_due} AND priority < 0 AND {claim_filters}
  ORDER BY {claim_order} LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
UNION ALL
(SELECT {columns} FROM {table} WHERE {expired_lease} AND {claim_filters} AND {expired_floor}
  ORDER BY {claim_order} LIMIT %(limit)s FOR UPDATE SKIP LOCKED)

-- name: probe
(SELECT 1 FROM {table} FORCE INDEX (intents_prioritized_mysql_idx)
  WHERE {prioritized_due} AND priority > 0 AND {claim_filters} LIMIT 1)
UNION ALL
(SELECT 1 FROM {table} FORCE INDEX (intents_claim_mysql_idx)
  WHERE {pending_due} AND priority = 0 AND {claim_filters} AND {floor} LIMIT 1)
UNION ALL
(SELECT 1 FROM {table} FORCE INDEX (intents_prioritized_mysql_idx)
  WHERE {prioritized_due} AND priority < 0 AND {claim_filters} LIMIT 1)
UNION ALL
(SELECT 1 FROM {table} WHERE {expired_lease} AND {claim_filters} AND {expired_floor} LIMIT 1)

-- name: claim_update
-- The locked rows, claimed by key. Each token is md5 of the claim's salt and
-- the id's UTF-8 bytes, whatever the table's charset: rows.take computes the same.
UPDATE {table} {by_id} SET state = 'running', attempts = attempts + 1,
  claim_token = MD5(CONCAT(%(salt)s, CONVERT(id USING utf8mb4))), claim_until = %(until)s,
  updated_at = %(now)s
WHERE id IN ([ids]) AND {active}

-- fragment: ordered_index
FORCE INDEX (intents_ordered_mysql_idx)

-- fragment: lock_rows
FOR UPDATE SKIP LOCKED

-- name: ordered_heads
-- As common.sql's, each a lookup per state (the index leads with it), the
-- earlier kept; the index holds the target's MD5 (migration 0015), and the
-- target is compared whole.
SELECT [pairs:(SELECT id FROM ((SELECT id, created_at FROM {table} {ordered_index}
  WHERE kind = %s AND state = 'pending' AND target_md5 = UNHEX(MD5(%s)) AND target = %s
  ORDER BY created_at, id LIMIT 1)
  UNION ALL (SELECT id, created_at FROM {table} {ordered_index}
  WHERE kind = %s AND state = 'running' AND target_md5 = UNHEX(MD5(%s)) AND target = %s
  ORDER BY created_at, id LIMIT 1)) AS h ORDER BY created_at, id LIMIT 1)]

-- name: kind_of
SELECT kind FROM {table} WHERE id = %(id)s

-- name: exhausted
-- The expired leases that used the last attempt, locked; exhausted_cancel cancels them.
SELECT id, kind FROM {table} WHERE {expired_lease} AND attempts >= {uncounted} + %(max_attempts)s
AND {of_kinds} FOR UPDATE SKIP LOCKED

-- name: exhausted_cancel
UPDATE {table} {by_id} SET state = 'cancelled', last_error = %(error)s, {done}
WHERE id IN ([ids])

-- name: lock_running
-- The running rows among the ids, locked, with their tokens: the fence is
-- tested on them before complete_many and finish_many update by key.
SELECT id, kind, claim_token FROM {table} {by_id} WHERE id IN ([ids]) AND state = 'running'
FOR UPDATE

-- name: complete_many
UPDATE {table} {by_id} SET state = 'completed', {done} WHERE id IN ([ids]) AND state = 'running'

-- name: finish_many
-- The held rows among a batch of endings (lock_running), each column set by a
-- CASE of its rows; an ending without a next_at or an error leaves it.
UPDATE {table} {by_id} SET
  state = CASE id [states:WHEN %s THEN %s] END,
  next_at = COALESCE(CASE id [next_ats:WHEN %s THEN %s] END, next_at),
  last_error = COALESCE(CASE id [errors:WHEN %s THEN %s] END, last_error),
  last_traceback = COALESCE(CASE id [tracebacks:WHEN %s THEN %s] END, last_traceback),
  snoozes = snoozes + CASE WHEN id IN ([snoozed]) THEN 1 ELSE 0 END,
  attempts = attempts - CASE WHEN id IN ([unstarted]) THEN 1 ELSE 0 END,
  {done}
WHERE id IN ([ids])

-- name: pause
-- As for insert: the kind was validated, so IGNORE only skips the known key.
INSERT IGNORE INTO {paused} (kind, paused_at) VALUES (%(kind)s, %(now)s)

-- name: get_lock
-- A limited claim's lock of one kind (mysql.py's limit_lock).
SELECT GET_LOCK(%(name)s, %(wait)s)

-- name: release_lock
SELECT RELEASE_LOCK(%(name)s)

-- name: rollup_add
-- As common.sql's, in MySQL's words for a conflict: VALUES(column) is the row
-- the flush tried to insert.
INSERT INTO {rollup} (minute, kind, completed, failed, snoozed, cancelled, attempts,
  duration_sum, duration_max, due, running)
VALUES [rows:(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)]
ON DUPLICATE KEY UPDATE
  completed = completed + VALUES(completed),
  failed = failed + VALUES(failed),
  snoozed = snoozed + VALUES(snoozed),
  cancelled = cancelled + VALUES(cancelled),
  attempts = attempts + VALUES(attempts),
  duration_sum = duration_sum + VALUES(duration_sum),
  duration_max = GREATEST(duration_max, VALUES(duration_max)),
  due = COALESCE(VALUES(due), due),
  running = COALESCE(VALUES(running), running)

-- name: target_insert
-- As for insert: IGNORE only skips the known key.
INSERT IGNORE INTO {targets} ({target_columns}, updated_at)
VALUES [rows:(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)]

-- name: pace_successes
-- common.sql's, with the target compared byte for byte: the column folds case
-- here (migration 0004 made only ids, kinds and tokens exact).
SELECT COUNT(*) FROM {table} WHERE state = 'completed' AND updated_at >= %(since)s
AND updated_at < %(until)s AND kind = %(kind)s AND BINARY target = %(target)s

-- name: replica_lag
-- A replica's status, no row on a server that replicates from none; its
-- Seconds_Behind_Master says how far behind it is (store/replicas.py).
SHOW SLAVE STATUS
