-- What every database writes the same way; a vendor's file replaces a block by
-- giving one of the same name (statements.py). Values the backend gives at load:
-- {table}, {live} (where the live intents are: the table but on PostgreSQL), {paused} (the quoted table names), {columns}, {claim_order} and
-- {order_within_priority} (rules.states.CLAIM_ORDER), {column_groups}.
--
-- State names are literals on purpose: the planner must see
-- "(state = 'pending' OR state = 'running')" to use the partial indexes whose
-- condition says exactly that (models.Intent.Meta).
--
-- A claim walks three branches in turn, priorities above 0, 0, below 0
-- (branch_high, branch_zero, branch_low), each up to what the claim still
-- needs, so that intents of the default priority 0, nearly always all of
-- them, are found exactly as before priorities existed: on the claim index
-- (intents_claimable_idx), from the pool's floor (floor.py). The other
-- priorities sit in a small index of their own (intents_high_priority_idx,
-- intents_low_priority_idx), which each claim probes in microseconds when it
-- is empty. One index led by priority would serve every row, but a floor on
-- next_at could no longer start its walk: every claim would step over all the
-- finished rows' entries that VACUUM has not yet removed.

-- Each rule, once ------------------------------------------------------------

-- fragment: active
(state = 'pending' OR state = 'running')

-- fragment: live_lease
-- A lease still held at %(now)s: an expired one is no longer live.
state = 'running' AND claim_until > %(now)s

-- fragment: expired_lease
-- The same test's other side: a lease that ran out by %(now)s.
state = 'running' AND claim_until <= %(now)s

-- fragment: pending_due
state = 'pending' AND next_at <= %(now)s

-- fragment: due
-- rules.states.due: a due pending intent, or a running one whose lease ran out.
-- The lease test is a negation so that PostgreSQL estimates it as barely
-- selective and walks the claim index in order instead of sorting every due row.
{active} AND next_at <= %(now)s AND NOT ({live_lease})

-- fragment: fence
-- One claimed row by its key. The state is spelled "(state = 'running') IS
-- TRUE" so that no planner can match it to the lease index's predicate: from
-- statistics that say almost nothing runs (an ANALYZE of a table of pending
-- intents), PostgreSQL walked every live lease in that index for each renewal.
id = %(id)s AND (state = 'running') IS TRUE AND claim_token = %(token)s

-- fragment: clear_claim
-- Every transition out of running clears the claim.
claim_token = '', claim_until = NULL

-- fragment: done
{clear_claim}, updated_at = %(now)s

-- fragment: retry_now_set
state = 'pending', next_at = %(now)s, {done}

-- fragment: cancel_set
state = 'cancelled', {done}

-- fragment: returning_kind
-- Every one-row transition says which kind it moved (MySQL reads it back).
RETURNING kind

-- fragment: by_id
-- An index hint after the table name for statements by id (MySQL's).

-- fragment: of_kinds
-- The optional kinds of a claim: %(every_kind)s true, or kind among [kinds].
(%(every_kind)s OR kind IN ([kinds]))

-- fragment: uncounted
-- rules.retries.counted: the attempts that do not count toward MAX_ATTEMPTS,
-- snoozes and those a redrive wrote off. Compared as a sum (attempts <
-- {uncounted} + cap): the columns are unsigned on MySQL, where a subtraction
-- may not go below 0.
snoozes + written_off

-- fragment: within_attempts
-- Leaves out expired leases that used the last attempt, when a cap is given.
(%(max_attempts)s IS NULL OR state = 'pending' OR attempts < {uncounted} + %(max_attempts)s)

-- fragment: not_paused
kind NOT IN (SELECT kind FROM {paused})

-- fragment: has_room
-- What a limited claim's scan leaves out (limited.py): kinds and
-- (kind, target) pairs with no room left.
(kind IN ([full_kinds])) IS NOT TRUE
AND ((kind, target) IN ([full_targets:(%s, %s)])) IS NOT TRUE

-- fragment: blocks
-- A TargetState row whose target no claim takes intents of (SPEC §14,
-- rules/targets.Health.blocks): held until a time to come, open, or half-open
-- with its probe out or probed by another claimer; %(exempt)s lists the keys
-- of the half-open targets this claimer read, of which it may take one intent
-- each as the probe.
state = 'open' OR state = 'held' AND until > %(now)s
OR state = 'half_open' AND (probe <> '' OR ({key} IN ([exempt])) IS NOT TRUE)

-- fragment: by_target
-- An index hint after TargetState's name in target_open (MySQL's).

-- fragment: target_open
-- One lookup per row walked on the (kind, target) index of migration 0016,
-- which finds nothing in an empty table; a set built per statement cost
-- SQLite more than the claim itself with a few hundred rows.
NOT EXISTS (SELECT 1 FROM {targets} AS s {by_target} WHERE s.kind = {table}.kind
  AND s.target = {table}.target AND ({blocks}))

-- fragment: claim_filters
-- The conditions of a claim and a due probe besides "due" and the branch.
{not_paused} AND {target_open} AND {of_kinds} AND {within_attempts} AND {has_room}

-- fragment: floor
-- The claim floor (floor.py), on the branch of priority 0; %(floor)s is the
-- earliest time there is when the claim has none.
next_at >= %(floor)s

-- Fenced transitions: each moves one claimed row while its token holds ----

-- name: renew
UPDATE {live} SET claim_until = %(until)s, updated_at = %(now)s WHERE {fence}

-- name: complete
UPDATE {live} SET state = 'completed', {done} WHERE {fence} {returning_kind}

-- name: attempts
SELECT attempts, {uncounted} FROM {live} WHERE {fence}

-- name: retry
UPDATE {live} SET state = 'pending', next_at = %(next_at)s, last_error = %(error)s, {done}
WHERE {fence} {returning_kind}

-- name: cancel_claim
UPDATE {live} SET state = 'cancelled', last_error = %(error)s, {done}
WHERE {fence} {returning_kind}

-- fragment: release_update
UPDATE {live} SET state = 'pending', next_at = %(now)s, {done} WHERE {fence}

-- name: release
{release_update} {returning_kind}

-- Unfenced transitions ----------------------------------------------------

-- name: complete_pending
UPDATE {live} SET state = 'completed', updated_at = %(now)s
WHERE id = %(id)s AND state = 'pending' {returning_kind}

-- fragment: retry_now_update
UPDATE {live} SET {retry_now_set} WHERE id = %(id)s AND {active}

-- name: retry_now
{retry_now_update} {returning_kind}

-- name: cancel
UPDATE {live} SET {cancel_set} WHERE id = %(id)s AND {active} {returning_kind}

-- name: exhausted
-- Cancels the expired leases that used the last attempt, of the kinds asked.
UPDATE {live} SET state = 'cancelled', last_error = %(error)s, {done}
WHERE {expired_lease} AND attempts >= {uncounted} + %(max_attempts)s AND {of_kinds}
{returning_kind}

-- The portable limited claim (limited.py) ------------------------------

-- name: live_leases
SELECT kind, target, COUNT(*) FROM {live}
WHERE {live_lease} AND kind IN ([kinds]) GROUP BY kind, target

-- Rates (limited.py) --------------------------------------------------------

-- name: rate_starts
-- Per target of one rated kind, the starts a start now must count, those after
-- %(since)s (rules.targets.Rate.recent): how many, and the oldest. Grouped by
-- the exact key: MySQL's target column folds case; a key's rows hold one target.
SELECT MIN(target), COUNT(*), MIN(started_at) FROM {starts}
WHERE kind = %(kind)s AND started_at > %(since)s GROUP BY target_key

-- name: rate_record
-- One start per intent a claim took of a rated kind.
INSERT INTO {starts} (target_key, kind, target, started_at) VALUES [rows:(%s, %s, %s, %s)]

-- name: rate_prune
-- The starts no claim of these kinds counts any more (limited.record_starts).
DELETE FROM {starts} WHERE kind IN ([kinds]) AND started_at <= %(before)s

-- name: ordered_heads
-- The head of each ordered target a claim found (limited.py): the oldest
-- intent of its kind and target that is pending or running, NULL for none;
-- one row, a column each, each the first entry of the target in the ordered
-- index of migration 0015.
SELECT [pairs:(SELECT id FROM {live} {ordered_index} WHERE kind = %s AND target = %s
  AND {active} ORDER BY created_at, id LIMIT 1)]

-- name: due_by_id
-- Of the heads found, those a claim may take now (limited.py), locked where
-- the database can.
SELECT {columns} FROM {live} {by_id} WHERE id IN ([ids]) AND {due} AND {within_attempts}
{lock_rows}

-- fragment: lock_rows
-- SQLite has no row locks: the claim holds the write lock.

-- fragment: ordered_index
-- The index after the table's name (SQLite's INDEXED BY, MySQL's FORCE INDEX).

-- Target health (store/targets.py) -----------------------------------------

-- fragment: target_columns
{key}, kind, target, state, failures, openings, until, last_error, probe, held_at, paced_until

-- name: target_rows
-- The rows of the targets an event concerns, locked while their change is decided.
SELECT {target_columns} FROM {targets} WHERE {key} IN ([keys]) FOR UPDATE

-- name: target_insert
-- A row for each target that needs one, before it is locked: first failures, holds.
INSERT INTO {targets} ({target_columns}, updated_at)
VALUES [rows:(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)]
ON CONFLICT DO NOTHING

-- name: target_save
UPDATE {targets} SET state = %s, failures = %s, openings = %s, until = %s, last_error = %s,
  probe = %s, held_at = %s, paced_until = %s, updated_at = %s WHERE {key} = %s

-- name: target_delete
DELETE FROM {targets} WHERE {key} IN ([keys])

-- name: target_watch
-- The targets of a pool's breakers that await a probe or have one out, and those
-- whose cooldown is over: a look on the state index, without a lock.
SELECT {target_columns} FROM {targets} WHERE kind IN ([kinds])
AND (state = 'half_open' OR state = 'open' AND until <= %(now)s)

-- name: target_probe
-- The one claim that takes a half-open target's probe; the others give theirs back.
UPDATE {targets} SET probe = %(id)s, updated_at = %(now)s
WHERE {key} = %(key)s AND state = 'half_open' AND probe = ''

-- name: probe_states
SELECT id, state, claim_until FROM {table} WHERE id IN ([ids])

-- name: target_ended
-- Holds that are over, and paces: their rows go, or keep what they still count.
SELECT {target_columns} FROM {targets} WHERE state = 'held' AND until <= %(now)s
OR state = 'closed' AND (failures = 0 AND paced_until IS NULL OR paced_until <= %(now)s)

-- name: pace_starts_delete
-- The starts recorded for targets whose pace is over, of kinds without a rate
-- (store/targets.ended): no claim of theirs will prune them now.
DELETE FROM {starts} WHERE target_key IN ([keys])

-- name: target_paces
-- The targets a handler's hold taught a pace that is not over (a look on the
-- index of migration 0017): the hold's start and end.
SELECT kind, target, held_at, until FROM {targets}
WHERE paced_until > %(now)s AND held_at IS NOT NULL AND until IS NOT NULL

-- name: pace_successes
-- The attempts of one target that completed from %(since)s to %(until)s: what its
-- partner took around a hold (rules.targets.learned_pace). On the index of the
-- finished intents' times, then the kind and target of each row in that span.
SELECT COUNT(*) FROM {table} WHERE state = 'completed' AND updated_at >= %(since)s
AND updated_at < %(until)s AND kind = %(kind)s AND target = %(target)s

-- Pauses ------------------------------------------------------------------

-- name: pause
INSERT INTO {paused} (kind, paused_at) VALUES (%(kind)s, %(now)s) ON CONFLICT DO NOTHING

-- name: resume
DELETE FROM {paused} WHERE kind = %(kind)s

-- name: paused
SELECT kind FROM {paused}

-- The admin (admin.py) ------------------------------------------------------

-- name: kinds
-- Every kind in the table, in order: a loose index scan, one lookup per kind.
WITH RECURSIVE k (kind) AS (SELECT MIN(kind) FROM {table} UNION ALL
SELECT (SELECT MIN(kind) FROM {table} WHERE kind > k.kind) FROM k WHERE k.kind IS NOT NULL)
SELECT kind FROM k WHERE kind IS NOT NULL

-- name: oldest_due
-- Per kind, when its longest-waiting due intent became claimable: two MIN
-- subqueries per kind, each of which the planner may answer by walking the
-- claim index (or the lease index) in order to the kind's first row.
SELECT [kinds:(SELECT MIN(next_at) FROM {live} WHERE kind = %s AND {pending_due}),
(SELECT MIN(claim_until) FROM {live} WHERE kind = %s AND {expired_lease})]

-- name: administer_select
SELECT id, kind, priority FROM {live} {by_id} WHERE id IN ([ids]) AND {active} FOR UPDATE

-- name: administer_retry_now
UPDATE {live} {by_id} SET {retry_now_set} WHERE id IN ([ids]) AND {active} {returning_moved}

-- name: administer_cancel
UPDATE {live} {by_id} SET {cancel_set} WHERE id IN ([ids]) AND {active} {returning_moved}

-- fragment: returning_moved
RETURNING id, kind, priority

-- name: administer_select_cancelled
SELECT id, kind, priority FROM {live} {by_id} WHERE id IN ([ids]) AND state = 'cancelled'
FOR UPDATE

-- name: administer_redrive
-- IntentManager.redrive: a cancelled intent due now with a fresh MAX_ATTEMPTS, the
-- attempts that counted so far written off (a CASE: MySQL's unsigned columns
-- may not be subtracted below 0). Fenced on the state, so an intent another
-- redrive moved meanwhile, even if a worker already holds it, is left alone.
UPDATE {live} {by_id} SET state = 'pending', next_at = %(now)s, updated_at = %(now)s,
  written_off = CASE WHEN attempts > snoozes THEN attempts - snoozes ELSE 0 END
WHERE id IN ([ids]) AND state = 'cancelled' {returning_moved}

-- name: rollup_add
-- A flush of the dashboard's per-minute tallies (observability/rollup.py):
-- several pools flush the same minute, so a conflict on (minute, kind) adds
-- the counts under the row's lock, keeps the longer attempt, and keeps the
-- row's depth sample when the flush carries none.
INSERT INTO {rollup} (minute, kind, completed, failed, snoozed, cancelled, attempts,
  duration_sum, duration_max, due, running)
VALUES [rows:(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)]
ON CONFLICT (minute, kind) DO UPDATE SET
  completed = {rollup}.completed + EXCLUDED.completed,
  failed = {rollup}.failed + EXCLUDED.failed,
  snoozed = {rollup}.snoozed + EXCLUDED.snoozed,
  cancelled = {rollup}.cancelled + EXCLUDED.cancelled,
  attempts = {rollup}.attempts + EXCLUDED.attempts,
  duration_sum = {rollup}.duration_sum + EXCLUDED.duration_sum,
  duration_max = {larger}({rollup}.duration_max, EXCLUDED.duration_max),
  due = COALESCE(EXCLUDED.due, {rollup}.due),
  running = COALESCE(EXCLUDED.running, {rollup}.running)
