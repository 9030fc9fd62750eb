-- SQLite: one writer at a time; a claim selects, then updates by key, inside
-- BEGIN IMMEDIATE (sqlite.py). UPDATE ... RETURNING exists.

-- name: insert
-- New intents, known ids left alone; the kind of each row written. Rows go as
-- one flat list of %s: a batch is thousands of values.
INSERT INTO {table} ({columns}) VALUES [rows:{column_group}]
ON CONFLICT (id) DO NOTHING RETURNING kind

-- name: claim
-- The due rows of each priority branch (see common.sql) in claim order, each up
-- to the claim's limit; the claim sorts what they found and keeps its limit.
-- Without ANALYZE statistics SQLite may prefer the (kind, state) index and
-- sort: INDEXED BY pins each branch to its partial index.
SELECT * FROM (SELECT {columns} FROM {table} INDEXED BY intents_high_priority_idx
  WHERE {due} AND priority > 0 AND {claim_filters}
  ORDER BY {claim_order} LIMIT %(limit)s) AS branch_high
UNION ALL
SELECT * FROM (SELECT {columns} FROM {table} INDEXED BY intents_claimable_idx
  WHERE {due} AND priority = 0 AND {claim_filters} AND {floor}
  ORDER BY {order_within_priority} LIMIT %(limit)s) AS branch_zero
UNION ALL
SELECT * FROM (SELECT {columns} FROM {table} INDEXED BY intents_low_priority_idx
  WHERE {due} AND priority < 0 AND {claim_filters}
  ORDER BY {claim_order} LIMIT %(limit)s) AS branch_low

-- name: probe
-- Whether a claim would find anything: each branch's first due row.
SELECT * FROM (SELECT 1 AS one FROM {table} INDEXED BY intents_high_priority_idx
  WHERE {due} AND priority > 0 AND {claim_filters} LIMIT 1) AS branch_high
UNION ALL
SELECT * FROM (SELECT 1 AS one FROM {table} INDEXED BY intents_claimable_idx
  WHERE {due} AND priority = 0 AND {claim_filters} AND {floor} LIMIT 1) AS branch_zero
UNION ALL
SELECT * FROM (SELECT 1 AS one FROM {table} INDEXED BY intents_low_priority_idx
  WHERE {due} AND priority < 0 AND {claim_filters} LIMIT 1) AS branch_low

-- name: claim_update
-- The selected rows, claimed by key. Each token is the claim's salt and 8
-- random bytes drawn per row, returned (rows.take).
UPDATE {table} SET state = 'running', attempts = attempts + 1,
  claim_token = %(salt)s || lower(hex(randomblob(8))), claim_until = %(until)s,
  updated_at = %(now)s
WHERE id IN ([ids]) AND {active} RETURNING id, claim_token

-- name: complete_many
-- The id list steers SQLite to the primary key rather than a scan of every
-- running row; the (id, token) pairs are the fence, written as VALUES: a
-- table SQLite looks each row up in, where a list of row values is compared
-- pair by pair for every row (a fifth of a no-op drain's time, measured).
UPDATE {table} SET state = 'completed', {done}
WHERE id IN ([ids]) AND state = 'running' AND (id, claim_token) IN (VALUES [pairs:(%s, %s)])
RETURNING id, kind

-- name: finish_many
-- A batch of fenced endings joined to its rows by id, in one statement; rows
-- as one flat list of %s. A CASE of a branch per intent, which SQLite tests in
-- order for every row, cost 14.5 µs an intent in a batch of 500, against 1.6
-- for the join.
WITH v(vid, vtoken, vstate, vnext, verror, vsnooze, vunstarted, vtrace) AS
  (VALUES [rows:(%s, %s, %s, %s, %s, %s, %s, %s)])
UPDATE {table} SET state = vstate, next_at = COALESCE(vnext, next_at),
  last_error = COALESCE(verror, last_error),
  last_traceback = COALESCE(vtrace, last_traceback), snoozes = snoozes + vsnooze,
  attempts = attempts - vunstarted, {clear_claim}, updated_at = %s
FROM v WHERE id = vid AND state = 'running' AND claim_token = vtoken
RETURNING id, kind, state

-- fragment: ordered_index
INDEXED BY intents_ordered_idx

-- name: begin_immediate
-- A write transaction that takes the write lock first (sqlite.py's write_transaction).
BEGIN IMMEDIATE

-- name: commit
COMMIT

-- name: rollback
ROLLBACK

-- fragment: larger
-- SQLite's two-argument MAX is its GREATEST.
MAX

-- name: data_version
-- Changes when another connection has committed; reading it takes no lock
-- (sqlite.py's CommitWatch).
PRAGMA data_version

-- name: target_rows
-- No FOR UPDATE: the write transaction holds SQLite's one write lock.
SELECT {target_columns} FROM {targets} WHERE {key} IN ([keys])

-- name: replica_lag
-- A file has no replica: never replaying.
SELECT NULL AS lag
