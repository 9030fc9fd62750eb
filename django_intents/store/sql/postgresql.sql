-- PostgreSQL: a claim is one statement, and a new or re-queued intent notifies
-- idle pools (NOTIFY is delivered at commit and dropped on rollback, which is
-- exactly the outbox promise). Lists go as arrays, so a statement's text never
-- changes with a batch's size. Values at load: {t_columns} (the columns as
-- t.column), {channel} and {priority_channel} (wakeup.py). Each claim must stay
-- under 4,096 bytes once bound (statements.bind sends %s placeholders): beyond
-- that psycopg converts a statement's placeholders again on every call
-- (tests/test_claim.py checks it).

-- fragment: not_paused
-- The paused kinds as an array computed once per statement (an InitPlan).
-- Spelled as a CASE the planner cannot see into, the test is taken to keep
-- almost every row, so the claim still walks the claim index in order and
-- stops at LIMIT; as "kind <> ALL (...)" it was estimated to keep one row and
-- the planner sorted every due row (the plan is checked by tests/test_pause.py).
(CASE WHEN kind = ANY (ARRAY(SELECT kind FROM {paused})) THEN NULL ELSE 1 END) IS NOT NULL

-- fragment: not_held
-- The same CASE leaves out the paused kinds and the targets held or open
-- (held_targets): a set read once, probed as a hash per row.
(CASE WHEN kind = ANY (ARRAY(SELECT kind FROM {paused})) OR (kind, target) IN ({held_targets})
  THEN NULL ELSE 1 END) IS NOT NULL

-- fragment: blocks
-- common.sql's, with the keys as an array.
state = 'open' OR state = 'held' AND until > %(now)s
OR state = 'half_open' AND (probe <> '' OR {key} <> ALL (%(exempt)s::text[]))

-- fragment: held_targets
-- The targets that block, as a set the claims read once per statement and
-- probe as a hash per row: a few rows on the state index. (A lookup per row
-- would need an index on (kind, target), whose entries PostgreSQL caps at a
-- third of a page, shorter than the longest target.)
SELECT kind, target FROM {targets} WHERE {blocks}

-- fragment: of_kinds
-- array_position, which no index can answer: the planner, knowing nothing of
-- what it returns, takes it to keep almost every row, and so walks the claim
-- index in order and stops at LIMIT. Written "kind IN (...)" it was served by
-- the (kind, state) index, which after a churn fetched every dead row version
-- of the kind; written "(kind || '') IN (...)" it was estimated to keep 0.5 %
-- of the rows, and on a vacuumed but never analysed table the planner then
-- fetched and sorted every due row.
(%(every_kind)s OR array_position(%(kinds)s::text[], kind::text) IS NOT NULL)

-- fragment: within_attempts
-- common.sql's test in fewer bytes, for the claims' 4,096: without a cap the
-- comparison is NULL, and the test, NOT FALSE, keeps the row.
(state = 'pending' OR attempts < {uncounted} + %(max_attempts)s) IS NOT FALSE

-- fragment: claim_filters
{not_held} AND {of_kinds} AND {within_attempts}

-- fragment: claim_high
-- The three priority branches of a claim (see common.sql), each a walk of its
-- partial index in its order; as conditions, to which a statement adds its own.
{due} AND priority > 0 AND {claim_filters}

-- fragment: claim_zero
{due} AND priority = 0 AND {claim_filters} AND {floor}

-- fragment: claim_low
{due} AND priority < 0 AND {claim_filters}

-- fragment: picked
id, state AS was, claim_until AS le

-- fragment: claim_due
-- The rows of "due", claimed: each token md5(salt || id), one salt per claim.
UPDATE {live} AS t SET state = 'running', attempts = t.attempts + 1,
  claim_token = md5(%(salt)s || t.id), claim_until = %(until)s, updated_at = %(now)s
FROM due WHERE t.id = due.id RETURNING {t_columns}, due.was, due.le

-- fragment: branch_union
SELECT * FROM branch_high UNION ALL SELECT * FROM branch_zero UNION ALL SELECT * FROM branch_low

-- fragment: room_zero
%(limit)s - (SELECT count(*) FROM branch_high)

-- fragment: room_low
%(limit)s - (SELECT count(*) FROM branch_high) - (SELECT count(*) FROM branch_zero)

-- fragment: notify_moved
-- After an update that returns kind and priority: a notification per kind.
SELECT kind, pg_notify('{channel}', kind),
  CASE WHEN priority <> 0 THEN pg_notify('{priority_channel}', kind) END FROM upd

-- fragment: notify_inserted
-- One notification and one result row per kind, not per intent; a kind with
-- intents of another priority among them is named on the priority channel too.
SELECT kind, count(*), pg_notify('{channel}', kind),
  CASE WHEN bool_or(priority <> 0) THEN pg_notify('{priority_channel}', kind) END
FROM ins GROUP BY kind

-- fragment: by_key
-- A batch's rows ("v", from its arrays) to the rows they name: by key, and
-- fenced by the token, which is never empty (so the row is running). A state
-- test let the planner choose from the statistics of the state: it
-- hash-joined the batch against every entry of the lease index, or compared
-- every running row with every row of the batch. With no state test the join
-- is by primary key on a large table and a hash join over one pass of the
-- table on a small one: linear either way.
t.id = v.id AND t.claim_token = v.token AND v.token <> ''

-- name: clock
-- clock_timestamp(), not now(): the transaction's start would be stale.
SELECT clock_timestamp()

-- name: listen
-- A pool's listener hears new due work on its own session (postgresql/listen.py).
LISTEN "{channel}"

-- name: listen_priority
-- ... and the kinds whose intents of another priority than 0 became due.
LISTEN "{priority_channel}"

-- name: notify
-- A NOTIFY as enqueue sends one: the listener's start-up self-test, and its stop.
SELECT pg_notify('{channel}', %(payload)s)

-- name: insert
-- The varying columns of every row in one JSON array: a text that never
-- changes with the batch's size, one parameter to adapt instead of thirteen
-- per row. A JSON null payload becomes SQL NULL; a row carries next_at only
-- when it was given one.
-- An id is unique across the partitions by its key (migration 0018): each
-- enqueue writes its key first, so that it and a move of the same id out of
-- the live partition (which writes the key too) meet on the key's primary key
-- and one waits for the other. A new key means a new intent; a known one
-- only that it may exist (retention leaves the keys of what it drops), so the
-- row itself is looked for: the slow path, for an enqueue of a known id only.
-- The CASE keeps the look from being planned as a join over every row.
WITH r AS MATERIALIZED (SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb) AS r(id text,
    kind text, event_id text, target text, payload jsonb, next_at timestamptz,
    priority smallint, trace_context text)),
k AS (INSERT INTO {keys} (id) SELECT id FROM r ON CONFLICT (id) DO NOTHING RETURNING id),
ins AS (INSERT INTO {live} (id, kind, event_id, target, payload, next_at, priority,
    trace_context, created_at, updated_at, state, attempts, snoozes, last_error, claim_token,
    claim_until)
  SELECT r.id, r.kind, r.event_id, r.target, r.payload, COALESCE(r.next_at, %(now)s),
    COALESCE(r.priority, 0), COALESCE(r.trace_context, ''), %(now)s, %(now)s, 'pending', 0, 0,
    '', '', NULL
  FROM r WHERE CASE WHEN r.id IN (SELECT id FROM k) THEN true
    ELSE NOT EXISTS (SELECT 1 FROM {table} AS x WHERE x.id = r.id) END
  ON CONFLICT (id) DO NOTHING RETURNING kind, priority)
{notify_inserted}

-- name: release
-- A released or retried-now intent is due now: it wakes idle pools as an enqueue would.
WITH upd AS ({release_update} RETURNING kind, priority) {notify_moved}

-- name: retry_now
WITH upd AS ({retry_now_update} RETURNING kind, priority) {notify_moved}

-- name: claim
-- Each branch locks the rows it picks and skips rows another claimer has
-- locked, so concurrent claims never see the same intent; MATERIALIZED keeps
-- it from being inlined and evaluated more than once. Each is limited to
-- what the claim still needs after the branches before it, so exactly the
-- intents claimed are locked. The outer LIMIT changes nothing but tells the
-- planner how few rows come: a limit it cannot compute is taken as a tenth of
-- the table, and it would then hash the whole table to join.
WITH branch_high AS MATERIALIZED (SELECT {picked} FROM {live} WHERE {claim_high}
  ORDER BY {claim_order} LIMIT %(limit)s FOR UPDATE SKIP LOCKED),
branch_zero AS MATERIALIZED (SELECT {picked} FROM {live} WHERE {claim_zero}
  ORDER BY {order_within_priority} LIMIT {room_zero} FOR UPDATE SKIP LOCKED),
branch_low AS MATERIALIZED (SELECT {picked} FROM {live} WHERE {claim_low}
  ORDER BY {claim_order} LIMIT {room_low} FOR UPDATE SKIP LOCKED),
due AS (SELECT * FROM ({branch_union}) AS u LIMIT %(limit)s)
{claim_due}

-- name: claim_zero
-- The claim of priority 0 alone: it plans in a third of the time of the three
-- branches (postgresql/backend.py says when a claim may take it).
WITH due AS MATERIALIZED (SELECT {picked} FROM {live} WHERE {claim_zero}
  ORDER BY {order_within_priority} LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
{claim_due}

-- name: probe
SELECT * FROM (SELECT 1 AS one FROM {live} WHERE {claim_high} LIMIT 1) AS branch_high
UNION ALL
SELECT * FROM (SELECT 1 AS one FROM {live} WHERE {claim_zero} LIMIT 1) AS branch_zero
UNION ALL
SELECT * FROM (SELECT 1 AS one FROM {live} WHERE {claim_low} LIMIT 1) AS branch_low

-- name: complete_many
-- A pool's completions move their rows out of the live partition at once, into
-- the partition of %(day)s, named %(partition)s (the pool makes it:
-- postgresql/days.py), where an update in place would leave them for the
-- pools' moves to write again. A DELETE into an INSERT, as move_out, and the
-- keys first, for the rows an enqueue of this release did not write. If the
-- day has no partition yet, they are completed in place, for a later move,
-- and the third column says so.
WITH k AS (INSERT INTO {keys} (id) SELECT unnest(%(ids)s::text[]) ON CONFLICT (id) DO NOTHING),
day AS MATERIALIZED (SELECT to_regclass(%(partition)s) IS NOT NULL AS made),
moved AS (DELETE FROM {live} AS t USING unnest(%(ids)s::text[], %(tokens)s::text[]) AS v(id, token)
  WHERE {by_key} AND (SELECT made FROM day) RETURNING t.*),
stayed AS (UPDATE {live} AS t SET state = 'completed', {done}
  FROM unnest(%(ids)s::text[], %(tokens)s::text[]) AS v(id, token)
  WHERE {by_key} AND NOT (SELECT made FROM day) RETURNING t.id, t.kind),
ins AS (INSERT INTO {table} (id, kind, event_id, target, payload, state, attempts, snoozes,
  written_off, priority, next_at, created_at, updated_at, last_error, last_traceback,
  claim_token, claim_until, trace_context, part)
  SELECT id, kind, event_id, target, payload, 'completed', attempts, snoozes, written_off,
  priority, next_at, created_at, %(now)s, last_error, last_traceback, '', NULL,
  trace_context, %(day)s FROM moved RETURNING id, kind)
SELECT id, kind, true FROM ins UNION ALL SELECT id, kind, false FROM stayed

-- name: finish_many
-- A batch of retries, cancellations and releases (endings.Ending), each
-- fenced; whether each is due now, and of another priority, for notify_kinds.
UPDATE {live} AS t SET state = v.state, next_at = COALESCE(v.next_at, t.next_at),
  last_error = COALESCE(v.error, t.last_error),
  last_traceback = COALESCE(v.trace, t.last_traceback),
  snoozes = t.snoozes + CASE WHEN v.snooze THEN 1 ELSE 0 END,
  attempts = t.attempts - CASE WHEN v.unstarted THEN 1 ELSE 0 END,
  {clear_claim}, updated_at = %(now)s
FROM unnest(%(ids)s::text[], %(tokens)s::text[], %(states)s::text[],
  %(next_ats)s::timestamptz[], %(errors)s::text[], %(snoozed)s::boolean[],
  %(unstarted)s::boolean[], %(tracebacks)s::text[])
  AS v(id, token, state, next_at, error, snooze, unstarted, trace)
WHERE {by_key}
RETURNING t.id, t.kind, t.state, t.next_at <= %(now)s, t.priority <> 0

-- name: notify_kinds
SELECT pg_notify('{channel}', kind) FROM unnest(%(kinds)s::text[]) AS kind
UNION ALL SELECT pg_notify('{priority_channel}', kind) FROM unnest(%(prioritized)s::text[]) AS kind

-- The claim of kinds with LIMITS (postgresql/limited.py) ----------------------

-- fragment: limited_filters
-- A limited claim tests pauses among the kinds with no room (fkd, the full kinds).
{of_kinds} AND {within_attempts}

-- fragment: has_room
-- Leaves out the targets and kinds with no room: two small sets computed once,
-- each probed as a hash per row, not a join, which would turn the ordered walk
-- of the claim index into a scan and a sort. Spelled as a CASE the planner
-- cannot see into, so that it takes the test to keep almost every row and walks
-- the index in order; written "<> ALL (...)" it was estimated to keep one row
-- in a hundred, and the planner sorted every due row.
(CASE WHEN (kind, target) IN (SELECT kind, target FROM ftg)
  OR kind IN (SELECT kind FROM fkd) THEN NULL ELSE 1 END) IS NOT NULL

-- fragment: limited_picked
id, kind, target, priority, next_at, created_at, state AS was, claim_until AS le

-- fragment: limited_start
-- The live leases of the limited kinds per target (%(limited)s, their caps in
-- the same order), and from them the targets and kinds with no room; a paused
-- kind has none (ftg, fkd: short names, for the claims that carry them must
-- stay under 4,096 bytes); a held or open target (held_targets) has
-- none either. Set for the rest of the transaction by the lock statement,
-- the live leases are read by a plain index scan, which marks the dead
-- entries of the lease index as it passes (lock_settings).
live AS MATERIALIZED (SELECT kind, target, count(*) AS n, min(next_at) AS sn FROM {live}
  WHERE {live_lease} AND kind = ANY (%(limited)s::text[]) GROUP BY kind, target),
caps AS MATERIALIZED (SELECT * FROM unnest(%(limited)s::text[], %(per_target)s::bigint[],
  %(running)s::bigint[]) AS c(kind, per_target, running)),
ftg AS MATERIALIZED (SELECT kind, target FROM live JOIN caps USING (kind)
  WHERE n >= per_target UNION ALL {held_targets}),
fkd AS MATERIALIZED (SELECT kind FROM live JOIN caps USING (kind)
  GROUP BY kind, running HAVING sum(n) >= running UNION ALL SELECT kind FROM {paused})

-- fragment: limited_high
branch_high AS MATERIALIZED (SELECT {limited_picked} FROM {live} AS t
  WHERE {due} AND priority > 0 AND {limited_filters} AND {has_room}
  ORDER BY {claim_order} LIMIT %(fetch)s FOR UPDATE OF t SKIP LOCKED)

-- fragment: limited_zero_where
{due} AND priority = 0 AND {limited_filters}

-- fragment: limited_low
branch_low AS MATERIALIZED (SELECT {limited_picked} FROM {live} AS t
  WHERE {due} AND priority < 0 AND {limited_filters} AND {has_room}
  ORDER BY {claim_order} LIMIT {limited_room_low} FOR UPDATE OF t SKIP LOCKED)

-- fragment: limited_room_low
%(fetch)s - (SELECT count(*) FROM branch_high) - (SELECT count(*) FROM branch_zero)

-- fragment: capped_rows
SELECT u.*, caps.per_target, caps.running

-- fragment: ranked
-- Each row's place at its target: its rank among the due rows plus the live
-- leases, joined, not looked up per row. Window functions cannot sit beside
-- FOR UPDATE, so they rank the union of the branches.
rk AS (SELECT due.*, row_number() OVER (PARTITION BY kind, target ORDER BY {claim_order})
  + COALESCE(live.n, 0) AS atg FROM due LEFT JOIN live USING (kind, target))

-- fragment: fits_target
per_target IS NULL OR atg <= per_target

-- fragment: fitting_by_kind
-- With a running cap in the claim, each row's place in its kind too.
ft AS (SELECT rk.*, row_number() OVER (PARTITION BY kind ORDER BY {claim_order})
  + COALESCE(kd.n, 0) AS akd FROM rk LEFT JOIN (SELECT kind, sum(n) AS n
  FROM live GROUP BY kind) AS kd USING (kind) WHERE {fits_target})

-- fragment: fitting_by_target
-- Without one the kind's rank is not asked for: one window and one sort fewer.
ft AS (SELECT rk.*, 0 AS akd FROM rk WHERE {fits_target})

-- fragment: limited_update
-- What fits, in claim order, claimed.
UPDATE {live} AS t SET state = 'running', attempts = t.attempts + 1,
  claim_token = md5(%(salt)s || t.id), claim_until = %(until)s, updated_at = %(now)s
FROM (SELECT id, was, le FROM ft WHERE running IS NULL OR akd <= running
  ORDER BY {claim_order} LIMIT %(limit)s) AS ch
WHERE t.id = ch.id RETURNING {t_columns}, ch.was, ch.le

-- fragment: limited_three
{limited_start}, {limited_high},
branch_zero AS MATERIALIZED (SELECT {limited_picked} FROM {live} AS t
  WHERE {limited_zero_where} AND {floor} AND {has_room} ORDER BY {order_within_priority}
  LIMIT %(fetch)s - (SELECT count(*) FROM branch_high) FOR UPDATE OF t SKIP LOCKED),
{limited_low},
due AS ({capped_rows} FROM ({branch_union}) AS u LEFT JOIN caps USING (kind)), {ranked}

-- fragment: limited_zero
{limited_start},
branch_zero AS MATERIALIZED (SELECT {limited_picked} FROM {live} AS t
  WHERE {limited_zero_where} AND {floor} AND {has_room} ORDER BY {order_within_priority}
  LIMIT %(fetch)s FOR UPDATE OF t SKIP LOCKED),
due AS ({capped_rows} FROM (SELECT * FROM branch_zero) AS u LEFT JOIN caps USING (kind)), {ranked}

-- name: limited_claim
-- The exact limited claim of every priority, without and with a running cap.
WITH {limited_three}, {fitting_by_target} {limited_update}

-- name: limited_claim_capped
WITH {limited_three}, {fitting_by_kind} {limited_update}

-- name: limited_claim_zero
-- The same of priority 0 alone.
WITH {limited_zero}, {fitting_by_target} {limited_update}

-- name: limited_claim_zero_capped
WITH {limited_zero}, {fitting_by_kind} {limited_update}

-- fragment: held_head
-- Where the walk of priority 0 starts: past the held-back head (heldhead.py).
-- lv: the levels, each valid while it and every level below name full targets;
-- kp: the valid ones; st: where the walk may start, the last valid level or the
-- floor; hd: the head, the first due intent from there that no valid level names.
lv AS MATERIALIZED (SELECT l.*, bool_and(l.shut) OVER (ORDER BY l.n) AS v FROM
  (SELECT l.*, ((l.kind, l.target) IN (SELECT kind, target FROM ftg)
   OR l.kind IN (SELECT kind FROM fkd)) AS shut FROM unnest(%(l_at)s::timestamptz[],
   %(l_created)s::timestamptz[], %(l_id)s::text[], %(l_kind)s::text[],
   %(l_target)s::text[]) WITH ORDINALITY AS l(at, cr, id, kind, target, n)) AS l),
kp AS MATERIALIZED (SELECT * FROM lv WHERE v),
st AS MATERIALIZED (SELECT * FROM (SELECT at, cr, id FROM kp UNION ALL
  SELECT COALESCE(%(head_floor)s::timestamptz, '-infinity'), '-infinity', '') AS s
  ORDER BY at DESC, cr DESC, id DESC LIMIT 1),
hd AS MATERIALIZED (SELECT t.next_at, t.created_at, t.id, t.kind, t.target
  FROM {live} AS t WHERE {limited_zero_where} AND (t.next_at, t.created_at, t.id)
  >= ((SELECT at FROM st), (SELECT cr FROM st), (SELECT id FROM st))
  AND (t.kind, t.target) NOT IN (SELECT kind, target FROM kp)
  ORDER BY {order_within_priority} LIMIT 1)

-- fragment: limited_head
{limited_start}, {held_head},
b0 AS MATERIALIZED (SELECT {limited_picked} FROM {live} AS t
  WHERE {limited_zero_where} AND (t.next_at, t.created_at, t.id) >= ((SELECT next_at FROM hd),
  (SELECT created_at FROM hd), (SELECT id FROM hd)) AND {has_room}
  ORDER BY {order_within_priority} LIMIT %(fetch)s FOR UPDATE OF t SKIP LOCKED),
due AS ({capped_rows} FROM (SELECT * FROM b0) AS u LEFT JOIN caps USING (kind)), {ranked}

-- fragment: head_info
-- After the claimed rows (heldhead.INFO_COLUMNS), from a one-row join that has
-- them even when the claim took nothing: the levels still valid, the head's key
-- and target, whether that target is full, the oldest next_at of the live leases.
SELECT cl.*, (SELECT count(*) FROM kp), hd.next_at, hd.created_at, hd.id, hd.kind,
  hd.target, (hd.kind, hd.target) IN (SELECT kind, target FROM ftg)
  OR hd.kind IN (SELECT kind FROM fkd), (SELECT min(sn) FROM live)
FROM (SELECT 1) AS one LEFT JOIN hd ON true LEFT JOIN cl ON true

-- name: limited_claim_head
-- The exact claim of priority 0 from past the held-back head.
WITH {limited_head}, {fitting_by_target}, cl AS ({limited_update}) {head_info}

-- name: limited_claim_head_capped
WITH {limited_head}, {fitting_by_kind}, cl AS ({limited_update}) {head_info}

-- fragment: room
-- While the fullest target of the limited kinds has room for the whole claim
-- under the smallest per_target, and all their live leases under the smallest
-- running cap, no intent can be held back: the claim is a plain one, gated.
room AS MATERIALIZED (SELECT spare >= %(limit)s AS ok, spare FROM (SELECT
  LEAST(%(least_per_target)s - COALESCE(max(n), 0), %(least_running)s - COALESCE(sum(n), 0))::bigint
  AS spare FROM (SELECT count(*) AS n FROM {live} WHERE {live_lease}
  AND kind = ANY (%(limited)s::text[]) GROUP BY kind, target) AS live) AS counted)

-- fragment: roomy_answer
-- The claimed rows, and whether there was room (even when none was taken).
SELECT cl.*, room.ok, room.spare FROM room LEFT JOIN cl ON true

-- name: roomy_claim
WITH {room},
branch_high AS MATERIALIZED (SELECT {picked} FROM {live} WHERE {claim_high}
  AND (SELECT ok FROM room) ORDER BY {claim_order} LIMIT %(limit)s FOR UPDATE SKIP LOCKED),
branch_zero AS MATERIALIZED (SELECT {picked} FROM {live} WHERE {claim_zero}
  AND (SELECT ok FROM room) ORDER BY {order_within_priority} LIMIT {room_zero}
  FOR UPDATE SKIP LOCKED),
branch_low AS MATERIALIZED (SELECT {picked} FROM {live} WHERE {claim_low}
  AND (SELECT ok FROM room) ORDER BY {claim_order} LIMIT {room_low} FOR UPDATE SKIP LOCKED),
due AS (SELECT * FROM ({branch_union}) AS u LIMIT %(limit)s),
cl AS ({claim_due}) {roomy_answer}

-- name: roomy_claim_zero
WITH {room},
due AS MATERIALIZED (SELECT {picked} FROM {live} WHERE {claim_zero} AND (SELECT ok FROM room)
  ORDER BY {order_within_priority} LIMIT %(limit)s FOR UPDATE SKIP LOCKED),
cl AS ({claim_due}) {roomy_answer}

-- fragment: lock_settings
-- For the rest of the claim's transaction: no bitmap scans. The live leases
-- are counted on the lease index, partial on "running", where every claim
-- and every completion leaves an entry until a vacuum; a bitmap scan never
-- marks such entries dead, so every claim visited all of them again. A plain
-- index scan marks them as it passes, and the next claims skip them.
set_config('enable_bitmapscan', 'off', true)

-- fragment: other_due
-- Whether intents of the limited kinds at other priorities are pending and
-- due: the first in each small partial index, in the index's own order. Not
-- EXISTS, which drops ORDER BY and LIMIT: with statistics from a time when
-- most intents had another priority, the planner answered it from the claim
-- index, reading every due intent.
(SELECT true FROM {live} WHERE {pending_due} AND priority > 0
  AND array_position(%(limited)s::text[], kind::text) IS NOT NULL
  ORDER BY {claim_order} LIMIT 1) IS NOT NULL
OR (SELECT true FROM {live} WHERE {pending_due} AND priority < 0
  AND array_position(%(limited)s::text[], kind::text) IS NOT NULL
  ORDER BY {claim_order} LIMIT 1) IS NOT NULL

-- name: limit_lock
-- The kinds' advisory locks, in the order given (unnest keeps it), and
-- whether intents of the kinds at other priorities are due.
SELECT count(pg_advisory_xact_lock(k)), {other_due}, {lock_settings}
FROM unnest(%(keys)s::bigint[]) AS k

-- name: limit_lock_only
SELECT count(pg_advisory_xact_lock(k)), {lock_settings} FROM unnest(%(keys)s::bigint[]) AS k

-- The claims of rated and ordered kinds (limited.py, portable; SPEC §14) --------

-- name: scan
-- The due rows a claim made in Python admits from (limited.py), each branch
-- locked as the claim's are; ftg and fkd are the targets and the kinds with
-- no room that the claim gives and the targets held or open (held_targets),
-- and the paused kinds.
WITH ftg AS MATERIALIZED (SELECT * FROM unnest(%(ft_kinds)s::text[], %(ft_targets)s::text[])
  AS f(kind, target) UNION ALL {held_targets}),
fkd AS MATERIALIZED (SELECT unnest(%(full_kinds)s::text[]) AS kind UNION ALL
  SELECT kind FROM {paused}),
branch_high AS MATERIALIZED (SELECT {columns} FROM {live} AS t WHERE {due} AND priority > 0
  AND {limited_filters} AND {has_room} ORDER BY {claim_order} LIMIT %(limit)s
  FOR UPDATE OF t SKIP LOCKED),
branch_zero AS MATERIALIZED (SELECT {columns} FROM {live} AS t WHERE {limited_zero_where}
  AND {floor} AND {has_room} ORDER BY {order_within_priority} LIMIT %(limit)s
  FOR UPDATE OF t SKIP LOCKED),
branch_low AS MATERIALIZED (SELECT {columns} FROM {live} AS t WHERE {due} AND priority < 0
  AND {limited_filters} AND {has_room} ORDER BY {claim_order} LIMIT %(limit)s
  FOR UPDATE OF t SKIP LOCKED)
{branch_union}

-- name: claim_update
-- The rows scan locked and the claim admitted, claimed by key (rows.take).
UPDATE {live} SET state = 'running', attempts = attempts + 1,
  claim_token = md5(%(salt)s || id), claim_until = %(until)s, updated_at = %(now)s
WHERE id = ANY (%(ids)s::text[]) AND {active} RETURNING id, claim_token

-- name: rate_prune
DELETE FROM {starts} WHERE kind = ANY (%(kinds)s::text[]) AND started_at <= %(before)s

-- name: ordered_heads
-- The head of each ordered target a claim found: the first entry of its kind
-- and target in the ordered index of migration 0015, keyed by md5(target),
-- since a target may be longer than a B-tree entry may be.
SELECT p.kind, p.target, head.id FROM unnest(%(kinds)s::text[], %(targets)s::text[])
  AS p(kind, target)
CROSS JOIN LATERAL (SELECT t.id FROM {live} AS t WHERE t.kind = p.kind
  AND md5(t.target) = md5(p.target) AND t.target = p.target AND {active}
  ORDER BY t.created_at, t.id LIMIT 1) AS head

-- name: due_by_id
SELECT {columns} FROM {live} WHERE id = ANY (%(ids)s::text[]) AND {due} AND {within_attempts}
FOR UPDATE SKIP LOCKED

-- The admin's estimates (estimate_rows) --------------------------------------

-- name: serial_plans
-- For the rest of the transaction: plans without parallel workers, whose
-- branches' row counts would otherwise be per worker.
SET LOCAL max_parallel_workers_per_gather = 0

-- name: parallel_plans
SET LOCAL max_parallel_workers_per_gather TO DEFAULT

-- fragment: larger
GREATEST

-- name: replica_lag
-- How far a replica's data is behind its primary: the time since the last
-- change it replayed (an upper bound while the primary writes nothing); NULL
-- on a server that is not replaying (a primary).
SELECT CASE WHEN pg_is_in_recovery()
  THEN EXTRACT(EPOCH FROM clock_timestamp() - pg_last_xact_replay_timestamp()) END AS lag

-- Finished intents out of the live partition, by day (migration 0018) ---------

-- fragment: day
-- The day a finished intent's partition is named for: days since 1970, UTC.
floor(extract(epoch FROM updated_at) / 86400)::integer

-- name: finished_batch
-- The next finished intents to move, locked, and their days: on the live
-- partition's index of finished rows.
SELECT id, {day} FROM {live} WHERE state = 'completed' OR state = 'cancelled'
ORDER BY updated_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED

-- name: keep_keys
-- Before a move, in its transaction: an enqueue of the same id meets it here.
INSERT INTO {keys} (id) SELECT unnest(%(ids)s::text[]) ON CONFLICT (id) DO NOTHING

-- name: move_out
-- A DELETE into an INSERT, not an UPDATE of part: a write of the same row that
-- comes second then waits and finds no row, as it would have before; an UPDATE
-- that moves a row makes it fail (SQLSTATE 40001) instead.
WITH moved AS (DELETE FROM {live} WHERE id = ANY (%(ids)s::text[])
  AND (state = 'completed' OR state = 'cancelled') RETURNING {columns})
INSERT INTO {table} ({columns}, part) SELECT {columns}, {day} FROM moved

-- name: days
-- The partitions of finished intents that have a day: name and day.
SELECT c.relname, substring(c.relname FROM '_d([0-9]+)$')::integer FROM pg_inherits AS i
JOIN pg_class AS c ON c.oid = i.inhrelid WHERE i.inhparent = %(parent)s::regclass
AND c.relname ~ '_d[0-9]+$'

-- name: unfinish
-- A redrive of cancelled intents that moved out: back into the live partition
-- as they are, then redriven there with the others (administer_redrive).
WITH back AS (DELETE FROM {table} WHERE part <> 0 AND id IN ([ids]) AND state = 'cancelled'
  RETURNING {columns})
INSERT INTO {live} ({columns}) SELECT {columns} FROM back
