-- The operators' statements (status, requeue, purge, show, the console's reads and actions,
-- grant), each under the name its module of outbox/operations calls it by (operations/sql.py
-- runs them through the store's execution helpers). Values are always bound parameters.

-- backlog_status --
-- Health of the backlog: counts by status and the ages an on-call engineer alerts on. The
-- backlog's own figures (Pending and Processing counted, the oldest due and oldest unpublished,
-- the expired leases) come from one read of its rows, not one each: in an incident it is most of
-- the table. Processed rows are counted up to $1 (NULL: all of them; the console counts a bounded
-- number, then estimates from the table's row estimate, estimated_rows, which VACUUM and ANALYZE
-- keep).
WITH backlog AS (
    SELECT count(*) FILTER (WHERE status = 'Pending') AS pending,
           count(*) FILTER (WHERE status = 'Processing') AS processing,
           min(created_at) FILTER (WHERE status = 'Pending' AND next_attempt_at <= now())
               AS oldest_due_pending,
           min(created_at) AS oldest_unpublished,
           count(*) FILTER (WHERE status = 'Processing'
                              AND (lease_expires_at IS NULL OR lease_expires_at <= now()))
               AS expired_leases
    FROM outbox_messages
    WHERE status IN ('Pending', 'Processing')
)
SELECT
    b.pending,
    b.processing,
    (SELECT count(*)
       FROM (SELECT 1 FROM outbox_messages WHERE status = 'Processed' LIMIT $1::bigint) AS p
    ) AS processed,
    -- On the partitioned layout, the partitions' estimates (autovacuum analyses no parent).
    (SELECT sum(GREATEST(c.reltuples, 0))::bigint FROM pg_class AS c
      WHERE c.oid = to_regclass('outbox_messages') AND c.relkind = 'r'
         OR c.oid IN (SELECT inhrelid FROM pg_inherits
                      WHERE inhparent = to_regclass('outbox_messages'))) AS estimated_rows,
    (SELECT count(*) FROM outbox_messages WHERE status = 'Failed') AS failed,
    extract(epoch FROM now() - b.oldest_due_pending)::float8 AS oldest_due_pending_age_seconds,
    extract(epoch FROM now() - b.oldest_unpublished)::float8 AS oldest_unpublished_age_seconds,
    (SELECT extract(epoch FROM now() - min(created_at))::float8
       FROM outbox_messages
      WHERE status = 'Failed') AS oldest_failed_age_seconds,
    b.expired_leases,
    (SELECT count(*)
       FROM outbox_messages
      WHERE next_attempt_at = 'infinity' AND ordering_key IS NOT NULL) AS held_back,
    -- The layout: only the partitioned one is described further (partitions.describe).
    COALESCE((SELECT relkind = 'p' FROM pg_class
               WHERE oid = to_regclass('outbox_messages')), false) AS partitioned,
    extract(epoch FROM clock_timestamp())::float8 AS database_now
FROM backlog AS b;

-- plan_on_indexes --
-- For the transaction of one requeue batch: planned on its indexes alone
-- (operations/replay.py, requeue_batch, says why)
SET LOCAL enable_sort = off; SET LOCAL enable_seqscan = off;

-- requeue_failed --
-- Put one batch of Failed rows back to Pending, due now, with a fresh attempt budget; history
-- is kept. Each filter applies when it is not NULL: $1 ids, $2 event type, $3/$4 created_at range
-- [from, to), $8 an endpoint (its failures only; a row that keeps no endpoint state failed at
-- its single endpoint, named after its event type), $9 text in last_error. Batches go in (created_at, id) order: $5/$6 the
-- last row of the batch before (NULL for the first), $7 the batch size; each starts where the
-- last one ended in outbox_messages_failed_order_idx, whatever number of rows share a created_at
-- (the condition holds for the first batch too, so it is always the index's bound). Only
-- endpoints that failed are sent it again ($8's alone, when given); those that got it are not.
-- Returns the rows it requeued (in no particular order: the caller sorts them to find where the
-- batch ended).
WITH candidates AS (
    SELECT outbox_message_id, created_at
    FROM outbox_messages
    WHERE status = 'Failed'
      AND ($1::uuid[] IS NULL OR outbox_message_id = ANY ($1::uuid[]))
      AND ($2::text IS NULL OR event_type = $2::text)
      AND ($3::timestamptz IS NULL OR created_at >= $3::timestamptz)
      AND ($4::timestamptz IS NULL OR created_at < $4::timestamptz)
      AND ($8::text IS NULL OR endpoint_state -> $8::text ->> 'status' = 'Failed'
           OR (endpoint_state IS NULL AND event_type = $8::text))
      AND ($9::text IS NULL OR strpos(lower(last_error), lower($9::text)) > 0)
      AND (created_at, outbox_message_id)
          > (COALESCE($5::timestamptz, '-infinity'),
             COALESCE($6::uuid, '00000000-0000-0000-0000-000000000000'))
    ORDER BY created_at, outbox_message_id
    LIMIT $7
),
batch AS (
    -- Locked apart from the ordered read above, which stays a merge of the partitions' indexes
    -- on the partitioned layout (operations/replay.py, requeue_batch).
    SELECT outbox_message_id
    FROM outbox_messages
    WHERE outbox_message_id = ANY (ARRAY(SELECT outbox_message_id FROM candidates))
      AND created_at BETWEEN (SELECT min(created_at) FROM candidates)
                         AND (SELECT max(created_at) FROM candidates)
      AND status = 'Failed'
    FOR UPDATE
)
UPDATE outbox_messages AS m
SET status = 'Pending',
    next_attempt_at = now(),
    attempt_count = 0,
    lease_expires_at = NULL,
    processed_at = NULL,
    endpoint_state = (
        SELECT jsonb_object_agg(
                   e.name,
                   CASE WHEN e.state ->> 'status' = 'Failed'
                             AND ($8::text IS NULL OR e.name = $8::text)
                        THEN jsonb_build_object('status', 'Pending', 'attempts', 0)
                        ELSE e.state END)
        FROM jsonb_each(m.endpoint_state) AS e(name, state))
-- (Ids as an array: joined to the CTE, the table could be read whole for each batch.)
WHERE m.outbox_message_id = ANY (ARRAY(SELECT outbox_message_id FROM batch))
RETURNING m.outbox_message_id, m.created_at;

-- count_failed --
-- What requeue_failed would touch, without touching it (the dry run): how many, the first
-- $5 of their ids, and the endpoints it would send them to again (a row without endpoint state
-- names its event type); $1…$4 as in requeue_failed, $6 its $8, $7 its $9
WITH matching AS (
    SELECT outbox_message_id, created_at, event_type, endpoint_state
    FROM outbox_messages
    WHERE status = 'Failed'
      AND ($1::uuid[] IS NULL OR outbox_message_id = ANY ($1::uuid[]))
      AND ($2::text IS NULL OR event_type = $2::text)
      AND ($3::timestamptz IS NULL OR created_at >= $3::timestamptz)
      AND ($4::timestamptz IS NULL OR created_at < $4::timestamptz)
      AND ($6::text IS NULL OR endpoint_state -> $6::text ->> 'status' = 'Failed'
           OR (endpoint_state IS NULL AND event_type = $6::text))
      AND ($7::text IS NULL OR strpos(lower(last_error), lower($7::text)) > 0)
)
SELECT (SELECT count(*) FROM matching) AS total,
       ARRAY(SELECT outbox_message_id FROM matching
             ORDER BY created_at, outbox_message_id LIMIT $5) AS first_ids,
       ARRAY(SELECT DISTINCT COALESCE(e.name, m.event_type)
             FROM matching AS m
             LEFT JOIN LATERAL jsonb_each(m.endpoint_state) AS e(name, state) ON true
             WHERE ($6::text IS NULL OR COALESCE(e.name, m.event_type) = $6::text)
               AND (e.name IS NULL OR e.state ->> 'status' = 'Failed')
             ORDER BY 1) AS endpoints;

-- purge_processed --
-- Delete one bounded batch of Processed rows finished more than $1 days ago ($2 rows at most),
-- read in created order after ($3, $4) (the last row the batch before deleted; NULLs: from the
-- start); returns how many went and the last of them, where the next batch goes on.
-- SKIP LOCKED and short transactions: it never waits for, or blocks, the relay.
-- A row is created before it is processed, so every row finished before the cutoff was created
-- before it: the scan reads outbox_messages_processed_order_idx (created_at, id) up to the
-- cutoff, and Processed rows carry no index on processed_at (one entry less for every outcome
-- write: docs/performance.md#wal-per-message). A row created before the cutoff but finished
-- after it is passed over, once per purge, thanks to the position.
WITH doomed AS (
    SELECT outbox_message_id, created_at
    FROM outbox_messages
    WHERE status = 'Processed'
      AND created_at < now() - make_interval(days => $1)
      AND (created_at, outbox_message_id)
          > (COALESCE($3::timestamptz, '-infinity'),
             COALESCE($4::uuid, '00000000-0000-0000-0000-000000000000'))
      AND processed_at < now() - make_interval(days => $1)
    ORDER BY created_at, outbox_message_id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
),
gone AS (
    DELETE FROM outbox_messages AS m
    USING doomed
    WHERE m.outbox_message_id = doomed.outbox_message_id
    RETURNING m.outbox_message_id, m.created_at
)
SELECT (SELECT count(*) FROM gone) AS deleted, last.created_at, last.outbox_message_id
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (
    SELECT created_at, outbox_message_id
    FROM gone
    ORDER BY created_at DESC, outbox_message_id DESC
    LIMIT 1
) AS last ON true;

-- purge_failed --
-- Delete one bounded batch of Failed rows created more than $1 days ago ($2 rows at most)
WITH doomed AS (
    SELECT outbox_message_id
    FROM outbox_messages
    WHERE status = 'Failed' AND created_at < now() - make_interval(days => $1)
    ORDER BY created_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM outbox_messages AS m
USING doomed
WHERE m.outbox_message_id = doomed.outbox_message_id;

-- purge_inbox --
-- Delete one bounded batch of inbox rows received more than $1 days ago ($2 rows at most); SKIP
-- LOCKED and short transactions: it never waits for, or blocks, a consumer
WITH doomed AS (
    SELECT webhook_id
    FROM outbox_inbox
    WHERE received_at < now() - make_interval(days => $1)
    ORDER BY received_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM outbox_inbox AS i
USING doomed
WHERE i.webhook_id = doomed.webhook_id;

-- show_message --
-- One message, every column
SELECT * FROM outbox_messages WHERE outbox_message_id = $1;

-- show_attempts --
-- A message's delivery attempts, oldest first
SELECT endpoint, attempt_number, lease_token, started_at, finished_at, duration_ms, outcome,
       applied, http_status, error_class, error, response_snippet
FROM outbox_attempts
WHERE outbox_message_id = $1
ORDER BY attempt_id;

-- open_breakers --
-- The endpoints whose breaker holds deliveries back, for status and endpoints, with its state:
-- 'open' while its cool-down runs; 'half-open' once that has passed while a probe is out or a
-- message waits for the endpoint (Pending or Processing, of its event type, not yet done there):
-- the next delivery is the probe that decides. A breaker whose cool-down has passed with nothing
-- waiting for it holds nothing back and is not listed (its row stays until an answer closes it:
-- the next message is sent at once, as its probe). The EXISTS runs only for those past their
-- cool-down, and stops at the first waiting message.
SELECT e.event_type, e.endpoint, e.consecutive_failures, e.opens, e.opened_at, e.reopen_at,
       e.probe_until > now() AS probing,
       CASE WHEN e.reopen_at > now() THEN 'open' ELSE 'half-open' END AS state
FROM outbox_endpoints AS e
WHERE e.reopen_at IS NOT NULL
  AND (e.reopen_at > now()
       OR e.probe_until > now()
       OR EXISTS (
            SELECT 1 FROM outbox_messages AS m
            WHERE m.status IN ('Pending', 'Processing')
              AND m.event_type = e.event_type
              AND COALESCE(m.endpoint_state -> e.endpoint ->> 'status', 'Pending') = 'Pending'))
ORDER BY e.event_type, e.endpoint;

-- console_scanned --
-- Not a statement: the clause the console's list reads from (views.console_statement), the newest
-- $13 rows after the page before ($9/$10), within the created_at range [$6, $7), of status $12 when
-- given: the newest $13 of each status, from its own index read backwards (Processed:
-- outbox_messages_processed_order_idx; Failed: outbox_messages_failed_order_idx; the backlog,
-- Pending and Processing: the due index, sorted), merged. However many rows match or none, a call
-- reads at most $13 rows of each.
SELECT * FROM (
    (SELECT outbox_message_id, event_type, status, attempt_count, created_at, next_attempt_at,
            processed_at, ordering_key, last_error, endpoint_state
     FROM outbox_messages
     WHERE status = 'Processed' AND ($12::text IS NULL OR $12::text = 'Processed')
       AND ($6::timestamptz IS NULL OR created_at >= $6::timestamptz)
       AND ($7::timestamptz IS NULL OR created_at < $7::timestamptz)
       AND ($9::timestamptz IS NULL
            OR (created_at, outbox_message_id) < ($9::timestamptz, $10::uuid))
     ORDER BY created_at DESC, outbox_message_id DESC
     LIMIT $13)
    UNION ALL
    (SELECT outbox_message_id, event_type, status, attempt_count, created_at, next_attempt_at,
            processed_at, ordering_key, last_error, endpoint_state
     FROM outbox_messages
     WHERE status = 'Failed' AND ($12::text IS NULL OR $12::text = 'Failed')
       AND ($6::timestamptz IS NULL OR created_at >= $6::timestamptz)
       AND ($7::timestamptz IS NULL OR created_at < $7::timestamptz)
       AND ($9::timestamptz IS NULL
            OR (created_at, outbox_message_id) < ($9::timestamptz, $10::uuid))
     ORDER BY created_at DESC, outbox_message_id DESC
     LIMIT $13)
    UNION ALL
    (SELECT outbox_message_id, event_type, status, attempt_count, created_at, next_attempt_at,
            processed_at, ordering_key, last_error, endpoint_state
     FROM outbox_messages
     WHERE status IN ('Pending', 'Processing')
       AND ($12::text IS NULL OR $12::text IN ('Pending', 'Processing'))
       AND ($12::text IS NULL OR status = $12::text)
       AND ($6::timestamptz IS NULL OR created_at >= $6::timestamptz)
       AND ($7::timestamptz IS NULL OR created_at < $7::timestamptz)
       AND ($9::timestamptz IS NULL
            OR (created_at, outbox_message_id) < ($9::timestamptz, $10::uuid))
     ORDER BY created_at DESC, outbox_message_id DESC
     LIMIT $13)
) AS merged
ORDER BY created_at DESC, outbox_message_id DESC
LIMIT $13

-- console_list_limits --
-- For the transaction of one page of the console's list: cancelled after $1 ms (text), and
-- planned for its parameters each time (a generic plan would not know which index a status or
-- a time range can use)
SELECT set_config('statement_timeout', $1, true),
       set_config('plan_cache_mode', 'force_custom_plan', true);

-- console_messages --
-- One page of the console's message list, newest first, keyset-paged on (created_at, id): of the
-- rows console_scanned reads (spliced in for "console_scanned" by views.console_statement), those
-- that every filter given matches: $1 status, $2 event type, $3/$4 an endpoint (the event types
-- that have it, $3, and its name, $4: a row without endpoint state is where its status says at
-- every endpoint), $5 ordering key, $8 text in last_error; at most $11, the scan read only as far
-- as the page needs. When the page is short and the scan read all its $13 rows, one more row
-- (scan_end) is the last row it read: the next call goes on from there.
WITH page AS (
    SELECT outbox_message_id, event_type, status, attempt_count, created_at, next_attempt_at,
           processed_at, ordering_key, left(last_error, 300) AS last_error, false AS scan_end
    FROM console_scanned AS scanned
    WHERE ($1::text IS NULL OR status = $1::text)
      AND ($2::text IS NULL OR event_type = $2::text)
      AND ($3::text[] IS NULL
           OR (event_type = ANY ($3::text[])
               AND (endpoint_state IS NULL OR endpoint_state ? $4::text)))
      AND ($5::text IS NULL OR ordering_key = $5::text)
      AND ($8::text IS NULL OR strpos(lower(last_error), lower($8::text)) > 0)
    ORDER BY created_at DESC, outbox_message_id DESC
    LIMIT $11
)
SELECT * FROM page
UNION ALL
SELECT outbox_message_id, NULL, NULL, NULL, created_at, NULL, NULL, NULL, NULL, true
FROM (SELECT created_at, outbox_message_id
      FROM console_scanned AS scanned
      ORDER BY created_at DESC, outbox_message_id DESC
      OFFSET $13 - 1
      LIMIT 1) AS scan_end
WHERE (SELECT count(*) FROM page) < $11;

-- console_rates --
-- Deliveries and failed attempts per minute over the last hour, from the attempt history
-- (60 rows, oldest first; minutes without attempts count 0)
WITH minutes AS (
    SELECT generate_series(date_trunc('minute', now()) - interval '59 minutes',
                           date_trunc('minute', now()), interval '1 minute') AS minute
),
counted AS (
    SELECT date_trunc('minute', finished_at) AS minute,
           count(*) FILTER (WHERE outcome = 'Processed') AS delivered,
           count(*) FILTER (WHERE outcome <> 'Processed') AS failed
    FROM outbox_attempts
    WHERE finished_at >= date_trunc('minute', now()) - interval '59 minutes'
    GROUP BY 1
)
SELECT m.minute, COALESCE(c.delivered, 0) AS delivered, COALESCE(c.failed, 0) AS failed
FROM minutes AS m
LEFT JOIN counted AS c USING (minute)
ORDER BY m.minute;

-- console_failure_reasons --
-- The latest $1 Failed messages (outbox_messages_failed_order_idx) grouped by their last_error
-- with what varies from one message to the next normalised, the cause kept whole: ids become
-- <id>, hex <hex>, quoted values '…' ("…"), numbers <n> but an HTTP status ("HTTP 503: upstream
-- <n>.<n>.<n>.<n> timed out after <n> ms", "shipping: gave up after <n> attempts: HTTP 500",
-- "no endpoint configured for event type '…' (set OUTBOX_WEBHOOKS)"); each reason with its
-- count and its event types, most frequent first. Each text is normalised once, however many
-- messages failed with it (the regular expressions, once a message, were most of the
-- overview's time over 10,000 failures).
WITH latest AS (
    SELECT event_type, left(COALESCE(last_error, '(no error recorded)'), 400) AS error
    FROM outbox_messages
    WHERE status = 'Failed'
    ORDER BY created_at DESC, outbox_message_id DESC
    LIMIT $1
),
errors AS (
    SELECT error, event_type, count(*) AS messages
    FROM latest
    GROUP BY error, event_type
),
reasons AS (
    SELECT event_type, messages,
           left(btrim(
               regexp_replace(
               regexp_replace(
               regexp_replace(
               regexp_replace(
               regexp_replace(error,
                   '[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}',
                   '<id>', 'g'),
                   '(^|[^[:alnum:]])''[^'']*''(?![[:alnum:]])', '\1''…''', 'g'),
                   '"[^"]*"', '"…"', 'g'),
                   '\m(0x[0-9A-Fa-f]+|(?=[0-9]*[A-Fa-f])[0-9A-Fa-f]{8,})\M', '<hex>', 'g'),
                   '(?<!HTTP )(?<![[:alnum:]_])[0-9]+', '<n>', 'g')), 200) AS reason
    FROM errors
)
SELECT reason, sum(messages)::bigint AS messages, array_agg(DISTINCT event_type) AS event_types
FROM reasons
GROUP BY reason
ORDER BY sum(messages) DESC, reason
LIMIT 20;

-- console_held_keys --
-- Ordering keys with messages parked behind an earlier one (next_attempt_at = 'infinity': only a
-- Pending row is parked, as backlog_status's held_back counts them), the most held first, at most
-- 20. Read from outbox_messages_held_idx alone, in key order: no row of the table is visited for
-- its status, however many are parked.
SELECT ordering_key, count(*) AS held
FROM outbox_messages
WHERE next_attempt_at = 'infinity'
  AND ordering_key IS NOT NULL
GROUP BY ordering_key
ORDER BY count(*) DESC, ordering_key
LIMIT 20;

-- paused_endpoints --
-- The endpoints paused by hand, for status and the console
SELECT event_type, endpoint, paused_at, paused_by
FROM outbox_paused_endpoints
ORDER BY event_type, endpoint;

-- pause_endpoint --
-- Pause endpoint ($1 event type, $2 name) for every relay, by key $3; true if it was not paused
INSERT INTO outbox_paused_endpoints (event_type, endpoint, paused_by)
VALUES ($1, $2, $3)
ON CONFLICT (event_type, endpoint) DO NOTHING
RETURNING true AS paused;

-- resume_endpoint --
-- Resume endpoint ($1, $2): its row goes, and its messages deferred while it was paused
-- (Pending, backing off, not parked behind a key, the endpoint's own delivery still to make)
-- are due now. Returns whether it was paused and how many messages were made due.
WITH resumed AS (
    DELETE FROM outbox_paused_endpoints
    WHERE event_type = $1 AND endpoint = $2
    RETURNING event_type
),
due AS (
    UPDATE outbox_messages AS m
    SET next_attempt_at = now()
    FROM resumed
    WHERE m.event_type = resumed.event_type
      AND m.status = 'Pending'
      AND m.next_attempt_at > now()
      AND m.next_attempt_at < 'infinity'
      AND COALESCE(m.endpoint_state -> $2::text ->> 'status', 'Pending') = 'Pending'
    RETURNING m.outbox_message_id
)
SELECT (SELECT count(*) FROM resumed) > 0 AS resumed, (SELECT count(*) FROM due) AS due;

-- claim_action --
-- Record action $1 (its client-chosen id) before doing it: $2 what, $3 its filter, $4 whether a
-- dry run, $5 who (a key's name, a principal's, "function key", "cli"), $6 the address and $7
-- the user agent they came with. A row back: this one does it; none: it was taken already.
INSERT INTO outbox_console_actions
    (action_id, action, filter, dry_run, actor, address, user_agent)
VALUES ($1, $2, $3::jsonb, $4, $5, $6, $7)
ON CONFLICT (action_id) DO NOTHING
RETURNING created_at;

-- finish_action --
-- Action $1's progress or, with $4, its end: how many rows it touched ($2) and its result ($3)
UPDATE outbox_console_actions
SET affected = $2, result = $3::jsonb,
    finished_at = CASE WHEN $4::bool THEN now() ELSE finished_at END
WHERE action_id = $1;

-- start_action --
-- Action $1's first progress ($2), unless it has some: a requeue in batches recorded by a call
-- that ended before writing it (or by a call racing this one) goes on rather than wait for ever
UPDATE outbox_console_actions SET result = $2::jsonb WHERE action_id = $1 AND result IS NULL;

-- run_action --
-- Whether this session runs action $1 now: a session-level advisory lock on the action's id,
-- tried, never waited for (false: another call runs it). It ends with the session, so a call
-- whose session was ended while it ran (terminated, connection lost) leaves no run behind, and
-- the action's next call runs it again. Released by end_action_run.
SELECT pg_try_advisory_lock(hashtextextended('outbox_console_actions:' || $1, 0));

-- end_action_run --
-- This session has finished running action $1 (run_action): another call may run it
SELECT pg_advisory_unlock(hashtextextended('outbox_console_actions:' || $1, 0));

-- lock_action --
-- Action $1's progress, its row locked until the transaction ends: the next batch of a requeue
-- and the progress it makes commit together, one call after another
SELECT action, filter::text AS filter, result::text AS result
FROM outbox_console_actions
WHERE action_id = $1
FOR UPDATE;

-- show_action --
-- One recorded action
SELECT action_id, action, filter::text AS filter, affected, dry_run, actor, created_at,
       result::text AS result
FROM outbox_console_actions
WHERE action_id = $1;

-- list_actions --
-- One page of the recorded actions, newest first, keyset-paged on (created_at, action_id): at
-- most $1, after the last row ($2, $3) of the page before (NULL: from the newest), of actor $4
-- and action $5 (each when given), created in [$6, $7)
SELECT action_id, action, filter::text AS filter, affected, dry_run, actor, address,
       user_agent, created_at, finished_at, result::text AS result
FROM outbox_console_actions
WHERE ($2::timestamptz IS NULL OR (created_at, action_id) < ($2::timestamptz, $3::text))
  AND ($4::text IS NULL OR actor = $4::text)
  AND ($5::text IS NULL OR action = $5::text)
  AND ($6::timestamptz IS NULL OR created_at >= $6::timestamptz)
  AND ($7::timestamptz IS NULL OR created_at < $7::timestamptz)
ORDER BY created_at DESC, action_id DESC
LIMIT $1;

-- resend_processed --
-- Send Processed message $1 again, due now, with a fresh attempt budget and the same id (so the
-- same webhook-id): to every endpoint ($2 NULL), or to endpoint $2 alone, the others of its
-- event type ($3, every configured name) kept as Processed. History is kept. Returns the row if
-- it was Processed (and so is sent again).
UPDATE outbox_messages
SET status = 'Pending',
    next_attempt_at = now(),
    attempt_count = 0,
    lease_expires_at = NULL,
    processed_at = NULL,
    endpoint_state = CASE
        WHEN $2::text IS NULL THEN NULL
        ELSE (SELECT jsonb_object_agg(
                         name,
                         jsonb_build_object(
                             'status', CASE WHEN name = $2::text THEN 'Pending' ELSE 'Processed' END,
                             'attempts', 0))
              FROM unnest($3::text[]) AS names(name))
    END
WHERE outbox_message_id = $1 AND status = 'Processed'
RETURNING outbox_message_id;

-- message_states --
-- The status and event type of each of messages $1 that exists (an action checks its ids)
SELECT outbox_message_id, status, event_type
FROM outbox_messages
WHERE outbox_message_id = ANY ($1::uuid[]);

-- cancel_pending --
-- Cancel message $1 if it is Pending (never one a relay is delivering): Failed, last_error $2;
-- the endpoints still owed it fail with the same error, those that got it stay Processed. One
-- parked behind its ordering key is parked no more (a Failed row waits for nothing). Returns the
-- row when it was Pending.
UPDATE outbox_messages
SET status = 'Failed',
    last_error = $2::text,
    lease_expires_at = NULL,
    next_attempt_at = CASE WHEN next_attempt_at = 'infinity' THEN now()
                           ELSE next_attempt_at END,
    endpoint_state = (
        SELECT jsonb_object_agg(
                   e.name,
                   CASE WHEN e.state ->> 'status' = 'Pending'
                        THEN e.state || jsonb_build_object('status', 'Failed', 'error', $2::text)
                        ELSE e.state END)
        FROM jsonb_each(endpoint_state) AS e(name, state))
WHERE outbox_message_id = $1 AND status = 'Pending'
RETURNING outbox_message_id;

-- release_after_cancel --
-- Under OUTBOX_ORDERING_ON_FAILURE=release, after messages $1 were cancelled: the first parked
-- message of each of their ordering keys goes, due now, when nothing unfinished comes before it
-- (as the outcome write lets the next one go after a failure). Returns those let go.
WITH keys AS (
    SELECT DISTINCT ordering_key
    FROM outbox_messages
    WHERE outbox_message_id = ANY ($1::uuid[]) AND ordering_key IS NOT NULL
),
first_held AS (
    SELECT f.outbox_message_id, f.ordering_key, f.ordering_seq
    FROM keys AS k
    CROSS JOIN LATERAL (
        SELECT p.outbox_message_id, p.ordering_key, p.ordering_seq
        FROM outbox_messages AS p
        WHERE p.next_attempt_at = 'infinity' AND p.ordering_key = k.ordering_key
        ORDER BY p.ordering_seq
        LIMIT 1
    ) AS f
)
UPDATE outbox_messages AS m
SET next_attempt_at = now()
FROM first_held AS f
WHERE m.outbox_message_id = f.outbox_message_id
  AND m.status = 'Pending'
  AND m.next_attempt_at = 'infinity'
  AND NOT EXISTS (
        SELECT 1
        FROM outbox_messages AS e
        WHERE e.ordering_key = f.ordering_key
          AND e.ordering_seq < f.ordering_seq
          AND e.status IN ('Pending', 'Processing'))
RETURNING m.outbox_message_id;

-- held_behind --
-- The message that holds Pending message $1 back: the first message of its ordering key before
-- it that is not Processed (nor Failed, unless $2: OUTBOX_ORDERING_ON_FAILURE=hold), read from
-- outbox_messages_ordering_idx. No row: nothing holds it.
SELECT h.outbox_message_id
FROM outbox_messages AS m
CROSS JOIN LATERAL (
    SELECT e.outbox_message_id
    FROM outbox_messages AS e
    WHERE e.ordering_key = m.ordering_key
      AND e.ordering_seq < m.ordering_seq
      AND e.status <> 'Processed'
      AND (e.status <> 'Failed' OR $2::bool)
    ORDER BY e.ordering_seq
    LIMIT 1
) AS h
WHERE m.outbox_message_id = $1 AND m.status = 'Pending' AND m.ordering_key IS NOT NULL;

-- show_payload --
-- Message $1's payload as the database writes it (JSON text): the console's download
SELECT payload::text AS payload FROM outbox_messages WHERE outbox_message_id = $1;

-- replay_plan --
-- What a replay would send again: of the Processed messages created in [$1, $2), of event type
-- $3 and of one of the event types $4 (each when given: $4 an endpoint's), how many (counted up
-- to $5) and the first $6 ids, in (created_at, id) order (outbox_messages_processed_order_idx)
WITH matching AS (
    SELECT outbox_message_id, created_at
    FROM outbox_messages
    WHERE status = 'Processed'
      AND created_at >= $1::timestamptz AND created_at < $2::timestamptz
      AND ($3::text IS NULL OR event_type = $3::text)
      AND ($4::text[] IS NULL OR event_type = ANY ($4::text[]))
    ORDER BY created_at, outbox_message_id
    LIMIT $5
)
SELECT (SELECT count(*) FROM matching) AS total,
       ARRAY(SELECT outbox_message_id FROM matching
             ORDER BY created_at, outbox_message_id LIMIT $6) AS sample;

-- replay_batch --
-- One batch of a replay: the Processed messages $1…$4 select (as in replay_plan) after ($5, $6),
-- the last row of the batch before (NULL: from the first), at most $7 in (created_at, id) order,
-- sent again as resend_processed does (due now, a fresh attempt budget, the same id): to every
-- endpoint ($8 NULL), or to endpoint $8 alone, the others of its event type ($9: each event
-- type's configured names) kept as Processed. Returns how many it read and resent, and the last
-- row it read, where the next batch goes on.
WITH batch AS (
    SELECT outbox_message_id, created_at
    FROM outbox_messages
    WHERE status = 'Processed'
      AND created_at >= $1::timestamptz AND created_at < $2::timestamptz
      AND ($3::text IS NULL OR event_type = $3::text)
      AND ($4::text[] IS NULL OR event_type = ANY ($4::text[]))
      AND (created_at, outbox_message_id)
          > (COALESCE($5::timestamptz, '-infinity'),
             COALESCE($6::uuid, '00000000-0000-0000-0000-000000000000'))
    ORDER BY created_at, outbox_message_id
    LIMIT $7
    FOR UPDATE
),
resent AS (
    UPDATE outbox_messages AS m
    SET status = 'Pending',
        next_attempt_at = now(),
        attempt_count = 0,
        lease_expires_at = NULL,
        processed_at = NULL,
        endpoint_state = CASE
            WHEN $8::text IS NULL THEN NULL
            ELSE (SELECT jsonb_object_agg(
                             name,
                             jsonb_build_object(
                                 'status', CASE WHEN name = $8::text THEN 'Pending'
                                                ELSE 'Processed' END,
                                 'attempts', 0))
                  FROM jsonb_array_elements_text($9::jsonb -> m.event_type) AS names(name))
        END
    FROM batch
    WHERE m.outbox_message_id = batch.outbox_message_id
      AND m.created_at = batch.created_at
      AND m.status = 'Processed'
    RETURNING m.outbox_message_id
)
SELECT (SELECT count(*) FROM batch) AS read, (SELECT count(*) FROM resent) AS resent,
       last.created_at, last.outbox_message_id
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (
    SELECT created_at, outbox_message_id
    FROM batch
    ORDER BY created_at DESC, outbox_message_id DESC
    LIMIT 1
) AS last ON true;

-- breaker_is_open --
-- Whether endpoint ($1, $2)'s breaker is open: cooling down, or past it and not yet closed by
-- an answer
SELECT EXISTS (
    SELECT 1 FROM outbox_endpoints
    WHERE event_type = $1 AND endpoint = $2 AND reopen_at IS NOT NULL);

-- probe_endpoint --
-- Endpoint ($1, $2)'s breaker due for its probe now (its cool-down over and no probe claimed:
-- the next delivery there claims it, and an answer closes it), and its messages waiting for it
-- (Pending, deferred, not parked behind a key, its own delivery still to make) due now. Returns
-- whether it had an open breaker and how many messages were made due.
WITH probed AS (
    UPDATE outbox_endpoints
    SET reopen_at = now(), probe_until = NULL, updated_at = now()
    WHERE event_type = $1 AND endpoint = $2 AND reopen_at IS NOT NULL
    RETURNING event_type
),
due AS (
    UPDATE outbox_messages AS m
    SET next_attempt_at = now()
    FROM probed
    WHERE m.event_type = probed.event_type
      AND m.status = 'Pending'
      AND m.next_attempt_at > now()
      AND m.next_attempt_at < 'infinity'
      AND COALESCE(m.endpoint_state -> $2::text ->> 'status', 'Pending') = 'Pending'
    RETURNING m.outbox_message_id
)
SELECT (SELECT count(*) FROM probed) > 0 AS probed, (SELECT count(*) FROM due) AS due;

-- endpoint_breakers --
-- Every endpoint's breaker row: the failures counted since its last success, since when and
-- until when it is open (NULL: closed), for the console's endpoints
SELECT event_type, endpoint, consecutive_failures, opened_at, reopen_at
FROM outbox_endpoints;

-- resend_started --
-- When message $1 was first resent from the console (NULL: never), to mark its later attempts
SELECT min(created_at) AS first_resend
FROM outbox_console_actions
WHERE action = 'resend' AND filter -> 'message_ids' ? $1::text;

-- endpoint_activity --
-- Each endpoint's attempts over the last hour (the attempt history has no index on time: for
-- `python -m outbox endpoints`, run by hand): the last success, the last failure, how many
-- attempts and how many failed
SELECT m.event_type, a.endpoint,
       max(a.finished_at) FILTER (WHERE a.outcome = 'Processed') AS last_success,
       max(a.finished_at) FILTER (WHERE a.outcome <> 'Processed') AS last_failure,
       count(*) AS attempts,
       count(*) FILTER (WHERE a.outcome <> 'Processed') AS failures
FROM outbox_attempts AS a
JOIN outbox_messages AS m USING (outbox_message_id)
WHERE a.finished_at >= now() - interval '1 hour'
  AND a.endpoint IS NOT NULL
GROUP BY m.event_type, a.endpoint;

-- outbox_owner --
-- The owner of outbox_messages (the role that migrated), NULL when there is no such table
SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = to_regclass('outbox_messages');

-- role_exists --
SELECT 1 FROM pg_roles WHERE rolname = $1;

-- is_azure --
-- Whether the server is Azure Database for PostgreSQL (its administrators' role exists)
SELECT 1 FROM pg_roles WHERE rolname = 'azure_pg_admin';

-- has_entra_functions --
-- Whether this database has Microsoft Entra's functions (Azure, with Entra authentication on)
SELECT to_regproc('pgaadauth_create_principal') IS NOT NULL;

-- create_entra_principal_with_oid --
-- A role for Microsoft Entra principal $1 of object id $2 and type $3 ('service', 'user',
-- 'group'): not an administrator, not a member of the administrators
SELECT * FROM pgaadauth_create_principal_with_oid($1, $2, $3, false, false);

-- create_entra_principal --
-- A role for Microsoft Entra principal $1, found by its name
SELECT * FROM pgaadauth_create_principal($1, false, false);

-- current_schema --
SELECT current_schema();

-- current_database --
SELECT current_database();

-- quote_ident --
-- $1 as PostgreSQL writes it in a statement (quoted where it must be)
SELECT quote_ident($1);

-- function_exists --
-- Whether function $1 (its signature, e.g. 'f(regclass, text)') exists
SELECT to_regprocedure($1) IS NOT NULL;

-- outbox_relations --
-- The outbox's tables (every partition too) and sequences in this schema, but those of $1 (the
-- consumer inbox's) and an identity column's own sequence: what grant gives the relay's role
SELECT c.relname, c.relkind::text AS kind FROM pg_class AS c
WHERE c.relnamespace = current_schema()::regnamespace
  AND c.relkind IN ('r', 'p', 'S') AND c.relname LIKE 'outbox\_%'
  AND c.relname <> ALL ($1::text[])
  AND NOT (c.relkind = 'S' AND EXISTS (
      SELECT 1 FROM pg_depend AS d
      WHERE d.objid = c.oid AND d.deptype = 'i'))  -- an identity column's own
ORDER BY c.relname;
