-- The store's statements, each under the name its module calls it by: the relay's
-- (outbox/store/postgres.py), those a caller runs in its own transaction (caller.py), the
-- migrations' bookkeeping (schema.py). The operators' are in outbox/operations/queries.sql, the
-- partitioned layout's in outbox/store/partitions/partitions.sql.
-- Values are always bound parameters; a {table} is a name the store checks before it fills it in.
--
-- The fast paths: shapes kept for a measured gain, each justified in docs/performance.md.
-- * lease_batch's LIMIT $4: the relay writes its usual batch size in (postgres.lease_statement), so
--   the lease is planned once per connection:
--   docs/performance.md#the-leases-batch-size-in-its-sql
-- * lease_batch, lease_past and next_due_in spell the due time's CASE exactly as the partial
--   index outbox_messages_due_idx does, and lease_batch's "free" the columns and condition of
--   outbox_messages_pending_unkeyed_idx; change one, change all:
--   docs/performance.md#the-due-indexes
-- * parking (next_attempt_at = 'infinity') in lease_batch, its letting go in the outcome writes,
--   release_held: docs/performance.md#parking-behind-a-held-key
-- * record_delivered, record_outcomes for a batch all delivered (the only near-variant of the
--   outcome write; both leave the same rows): docs/performance.md#the-lean-outcome-write
-- * the outcome writes take one array per column, not JSON:
--   docs/performance.md#outcomes-bound-as-arrays
-- * the outcome writes' "kept" clause locks what a foreign key's check would (outbox_attempts has
--   none; statement triggers delete a deleted message's history):
--   docs/performance.md#the-attempt-history-without-a-foreign-key
-- * every update of a row lands on its own page (fillfactor 50, migration 0009):
--   docs/performance.md#room-on-each-page-for-the-next-version
-- * insert_new_message, insert_message without ON CONFLICT:
--   docs/performance.md#an-insert-without-on-conflict

-- insert_message --
-- Add a Pending row, due now, inside the caller's transaction; returns nothing when the id exists.
-- $4 is the optional ordering key: keyed rows also take their place in the ordering sequence.
-- $5 is the producer's trace context (JSON text), or NULL. The function (migration 0019) is the
-- same INSERT … ON CONFLICT DO NOTHING on the plain table, and claims the id in
-- outbox_message_ids first on the partitioned one (outbox/store/partitions/conversion.py).
SELECT outbox_insert_message($1, $2, $3::jsonb, $4::text, $5::jsonb) AS outbox_message_id;

-- insert_new_message --
-- insert_message for an id the producer generated (a UUIDv7 with 74 bits that differ between the
-- ids of one millisecond, never in the table): without ON CONFLICT, whose speculative insertion
-- writes one more WAL record per message.
INSERT INTO outbox_messages
    (outbox_message_id, event_type, payload, status, next_attempt_at, ordering_key, ordering_seq,
     trace_context)
VALUES ($1, $2, $3::jsonb, 'Pending', now(), $4::text,
        CASE WHEN $4::text IS NOT NULL THEN nextval('outbox_messages_ordering_seq') END,
        $5::jsonb)
RETURNING outbox_message_id;

-- enqueued_messages --
-- The messages as the caller's transaction sees them ($1: of one event type, or NULL: all), oldest
-- first, their payloads as the relay sends them: what outbox.testing asserts on
SELECT outbox_message_id, event_type, payload::text, ordering_key, status, created_at
FROM outbox_messages
WHERE $1::text IS NULL OR event_type = $1::text
ORDER BY created_at, outbox_message_id;

-- claim_inbox --
-- A consumer records a received webhook id ($1) inside its own transaction: returns the id the
-- first time, nothing when it is already recorded. A concurrent claim of the same id waits for the
-- first transaction: nothing once it commits, the id if it rolls back.
INSERT INTO outbox_inbox (webhook_id)
VALUES ($1)
ON CONFLICT (webhook_id) DO NOTHING
RETURNING webhook_id;

-- lease_batch --
-- Claim due Pending rows and rows whose lease expired; $1 = lease seconds,
-- $2 = whether a Failed message holds back later messages with its ordering key,
-- $3 = the largest payload to return: a bigger one (only a row written by hand can be) comes back
-- as NULL with its size, so a batch of them cannot fill the relay's memory; $4 = batch size (the
-- relay writes its usual batch size in instead, postgres.lease_statement: no parameter then changes
-- the plan, and the server plans the statement once per connection rather than at every lease).
-- A row's due time is next_attempt_at while Pending and lease_expires_at while Processing (a
-- lease expired by hand takes effect at once); the partial index over that expression
-- (outbox_messages_due_idx) serves both halves of the seed's condition in one ordered scan.
-- A Processing row without any lease (set by hand) belongs to no worker: it is claimable too.
-- A keyed row is due only when no earlier row with its key is still waiting; one that waits
-- behind a message that is not being delivered (Pending, or Failed where that holds the key) is
-- parked instead (next_attempt_at = 'infinity'), so no later lease reads it again until the
-- message before it is done, and so are the rows queued behind it in its key, in bulk. Parking
-- takes none of the batch: when the scan met rows to park, the batch is filled from the due
-- rows without a key (their own index) and the first due message of other keys (a loose scan
-- of the ordering index, at most 10,000 keys), however many rows wait behind held keys.
-- One row per leased message, and one without columns (lease_token NULL) giving the number of
-- rows parked, if any.
WITH due AS (
    SELECT m.outbox_message_id, m.ordering_key, m.ordering_seq, m.created_at,
           (CASE WHEN m.status = 'Processing'
                 THEN COALESCE(m.lease_expires_at, '-infinity'::timestamptz)
                 ELSE m.next_attempt_at END) AS due_at,
           before.outbox_message_id AS waits_for
    FROM outbox_messages AS m
    LEFT JOIN LATERAL (
        -- The nearest earlier message of its key that is still in the way (ordering index).
        SELECT e.outbox_message_id, e.status, e.next_attempt_at
        FROM outbox_messages AS e
        -- A row without a key (most) skips the probe: a one-time filter, not an index scan.
        WHERE m.ordering_key IS NOT NULL
          AND e.ordering_key = m.ordering_key
          AND e.ordering_seq < m.ordering_seq
          AND e.status <> 'Processed'
          AND (e.status <> 'Failed' OR $2::bool)
        ORDER BY e.ordering_seq DESC
        LIMIT 1
    ) AS before ON true
    WHERE m.status IN ('Pending', 'Processing')
      AND (CASE WHEN m.status = 'Processing'
                THEN COALESCE(m.lease_expires_at, '-infinity'::timestamptz)
                ELSE m.next_attempt_at END) <= now()
      -- Free, or waiting behind a message that is not in flight (parked below); one whose
      -- predecessor is being delivered is left for a later lease.
      AND (before.outbox_message_id IS NULL OR before.status <> 'Processing')
    ORDER BY (CASE WHEN m.status = 'Processing'
                   THEN COALESCE(m.lease_expires_at, '-infinity'::timestamptz)
                   ELSE m.next_attempt_at END),
             m.created_at
    FOR UPDATE OF m SKIP LOCKED
    LIMIT $4
),
free AS (
    -- Only when the scan above met rows to park (a one-time check, else never read): the due
    -- Pending rows without a key, from their own index (outbox_messages_pending_unkeyed_idx),
    -- which rows behind held keys, however many and however old, never enter. (An expired lease
    -- without a key is not in it: the scan above meets it in its due order.)
    SELECT m.outbox_message_id, m.created_at, m.next_attempt_at AS due_at
    FROM outbox_messages AS m
    WHERE EXISTS (SELECT 1 FROM due WHERE due.waits_for IS NOT NULL)
      AND m.ordering_key IS NULL
      AND m.status = 'Pending'
      AND m.next_attempt_at <= now()
    ORDER BY m.next_attempt_at, m.created_at
    FOR UPDATE OF m SKIP LOCKED
    LIMIT $4
),
heads AS (
    -- Only when the scan above met rows to park and was cut short by the batch size (else it
    -- read every due row, these too): the first message of each ordering key that may go
    -- (nothing before it in its key still waiting: its first row not Processed, or under
    -- release its first after the Failed ones), if it is due. A loose scan of the ordering
    -- index (outbox_messages_ordering_idx): one probe per key, in key order, read only until
    -- the batch is full and at most 10,000 keys a lease; a key held by a Failed message or one
    -- backing off costs its probe and yields nothing. So rows queued behind held keys, however
    -- many, do not keep the messages of other keys waiting while they are parked.
    WITH RECURSIVE keys AS (
        (SELECT e.ordering_key, e.ordering_seq, e.outbox_message_id, e.status, e.event_type,
                e.created_at,
                (CASE WHEN e.status = 'Processing'
                      THEN COALESCE(e.lease_expires_at, '-infinity'::timestamptz)
                      ELSE e.next_attempt_at END) AS due_at,
                1 AS visited
         FROM outbox_messages AS e
         WHERE EXISTS (SELECT 1 FROM due WHERE due.waits_for IS NOT NULL)
           AND (SELECT count(*) FROM due) >= $4::bigint
           AND e.ordering_key IS NOT NULL
           AND e.status <> 'Processed'
         ORDER BY e.ordering_key, e.ordering_seq
         LIMIT 1)
        UNION ALL
        SELECT n.ordering_key, n.ordering_seq, n.outbox_message_id, n.status, n.event_type,
               n.created_at, n.due_at, k.visited + 1
        FROM keys AS k
        CROSS JOIN LATERAL (
            SELECT e.ordering_key, e.ordering_seq, e.outbox_message_id, e.status, e.event_type,
                   e.created_at,
                   (CASE WHEN e.status = 'Processing'
                         THEN COALESCE(e.lease_expires_at, '-infinity'::timestamptz)
                         ELSE e.next_attempt_at END) AS due_at
            FROM outbox_messages AS e
            WHERE e.ordering_key > k.ordering_key
              AND e.status <> 'Processed'
            ORDER BY e.ordering_key, e.ordering_seq
            LIMIT 1
        ) AS n
        WHERE k.visited < 10000
    ),
    firsts AS (
        SELECT k.outbox_message_id, k.status, k.event_type, k.created_at, k.due_at
        FROM keys AS k
        WHERE k.status <> 'Failed' OR $2::bool
        UNION ALL
        -- Under release a Failed message lets the rest of its key go: the first after it.
        SELECT f.outbox_message_id, f.status, f.event_type, f.created_at, f.due_at
        FROM keys AS k
        CROSS JOIN LATERAL (
            SELECT e.outbox_message_id, e.status, e.event_type, e.created_at,
                   (CASE WHEN e.status = 'Processing'
                         THEN COALESCE(e.lease_expires_at, '-infinity'::timestamptz)
                         ELSE e.next_attempt_at END) AS due_at
            FROM outbox_messages AS e
            WHERE e.ordering_key = k.ordering_key
              AND e.ordering_seq > k.ordering_seq
              AND e.status NOT IN ('Processed', 'Failed')
            ORDER BY e.ordering_seq
            LIMIT 1
        ) AS f
        WHERE k.status = 'Failed' AND NOT $2::bool
    )
    -- Locked as the due rows are, and checked again at their latest version (by id: the due
    -- time is spelled so that no plan reads the due index for it).
    SELECT m.outbox_message_id, m.created_at,
           (CASE WHEN m.status = 'Processing'
                 THEN COALESCE(m.lease_expires_at, '-infinity'::timestamptz)
                 ELSE m.next_attempt_at END) AS due_at
    FROM outbox_messages AS m
    WHERE m.outbox_message_id = ANY (ARRAY(
              SELECT h.outbox_message_id
              FROM firsts AS h
              WHERE h.status IN ('Pending', 'Processing')
                AND h.due_at <= now()
              LIMIT $4))
      AND ((m.status = 'Pending' AND m.next_attempt_at <= now())
           OR (m.status = 'Processing'
               AND COALESCE(m.lease_expires_at, '-infinity'::timestamptz) <= now()))
    FOR UPDATE OF m SKIP LOCKED
),
batch AS (
    -- The messages leased: the first of those free to go, in due order.
    SELECT c.outbox_message_id, c.created_at
    FROM (SELECT outbox_message_id, due_at, created_at FROM due WHERE waits_for IS NULL
          UNION
          SELECT outbox_message_id, due_at, created_at FROM free
          UNION
          SELECT outbox_message_id, due_at, created_at FROM heads) AS c
    ORDER BY c.due_at, c.created_at
    LIMIT $4
),
holding AS (
    -- The messages the parked rows wait behind, locked and checked again at their latest
    -- version: none of them can move on (be leased, requeued, purged) before the parking
    -- commits, so the statement that later lets a parked row go always sees it parked.
    -- (Ids as arrays: the planner knows nothing of a CTE's rows and would read the table.)
    SELECT e.outbox_message_id
    FROM outbox_messages AS e
    WHERE e.outbox_message_id = ANY (ARRAY(SELECT waits_for FROM due))
      AND (e.status = 'Pending' OR (e.status = 'Failed' AND $2::bool))
    FOR SHARE OF e SKIP LOCKED
),
waiting AS (
    SELECT due.outbox_message_id, due.ordering_key, due.ordering_seq
    FROM due
    JOIN holding ON holding.outbox_message_id = due.waits_for
),
held_keys AS (
    -- Each key with a row parked here, its last such row, and how many keys share the bulk.
    SELECT ordering_key, max(ordering_seq) AS after_seq, count(*) OVER () AS keys
    FROM waiting
    GROUP BY ordering_key
),
behind AS (
    -- The next rows of each such key (ordering index), at most 10,000 in all: those queued up
    -- to the first that is not Pending and due (in flight, failed, backing off, parked) wait
    -- behind the row parked here.
    SELECT b.outbox_message_id, b.ordering_key, b.ordering_seq,
           bool_and(b.queued) OVER (PARTITION BY b.ordering_key ORDER BY b.ordering_seq)
               AS queued
    FROM held_keys AS h
    CROSS JOIN LATERAL (
        SELECT e.outbox_message_id, e.ordering_key, e.ordering_seq,
               e.status = 'Pending' AND e.next_attempt_at <= now() AS queued
        FROM outbox_messages AS e
        WHERE e.ordering_key = h.ordering_key
          AND e.ordering_seq > h.after_seq
          AND e.status <> 'Processed'
        ORDER BY e.ordering_seq
        LIMIT 10000 / h.keys
    ) AS b
),
bulk AS (
    -- Locked as the due rows are, at their latest version: one locked elsewhere, or changed
    -- meanwhile, ends its key's run (below), so every row parked here waits behind one this
    -- lease holds.
    SELECT e.outbox_message_id
    FROM outbox_messages AS e
    WHERE e.outbox_message_id = ANY (ARRAY(SELECT outbox_message_id FROM behind WHERE queued))
      AND e.status = 'Pending'
      AND e.next_attempt_at <= now()
    FOR UPDATE OF e SKIP LOCKED
),
run AS (
    SELECT b.outbox_message_id,
           bool_and(l.outbox_message_id IS NOT NULL)
               OVER (PARTITION BY b.ordering_key ORDER BY b.ordering_seq) AS unbroken
    FROM behind AS b
    LEFT JOIN bulk AS l ON l.outbox_message_id = b.outbox_message_id
    WHERE b.queued
),
parked AS (
    UPDATE outbox_messages AS m
    SET next_attempt_at = 'infinity'
    WHERE m.outbox_message_id = ANY (ARRAY(
        SELECT outbox_message_id FROM waiting
        UNION ALL
        SELECT outbox_message_id FROM run WHERE unbroken))
    RETURNING m.outbox_message_id
),
leased AS (
    UPDATE outbox_messages AS m
    SET status = 'Processing',
        attempt_count = m.attempt_count + 1,
        processing_started_at = now(),
        lease_expires_at = now() + make_interval(secs => $1),
        next_attempt_at = now() + make_interval(secs => $1),
        lease_token = gen_random_uuid()
    WHERE m.outbox_message_id = ANY (ARRAY(SELECT outbox_message_id FROM batch))
      -- On the partitioned layout, only the partitions of the batch's rows are read.
      AND m.created_at BETWEEN (SELECT min(created_at) FROM batch)
                           AND (SELECT max(created_at) FROM batch)
    RETURNING m.outbox_message_id, m.event_type, m.payload::text AS payload_text,
              m.attempt_count, m.lease_token, m.created_at, m.ordering_key,
              m.endpoint_state::text AS endpoint_state, m.trace_context::text AS trace_context
),
troubled AS (
    -- The endpoints whose breaker counts failures or is open, and those paused by hand, for
    -- every relay to act on.
    SELECT json_agg(json_build_object(
               'event_type', event_type, 'endpoint', endpoint,
               'failures', COALESCE(e.consecutive_failures, 0), 'opens', COALESCE(e.opens, 0),
               'reopen_in', extract(epoch FROM e.reopen_at - now()),
               'probing', COALESCE(e.probe_until > now(), false),
               'paused', p.paused_at IS NOT NULL))::text AS endpoints
    FROM (SELECT * FROM outbox_endpoints
          WHERE consecutive_failures > 0 OR reopen_at IS NOT NULL) AS e
    FULL JOIN outbox_paused_endpoints AS p USING (event_type, endpoint)
)
-- The payload is turned into text once per row (RETURNING cannot share an expression). The
-- leased rows, then the count of parked ones; the clock and the breakers are read once.
SELECT leased.outbox_message_id, leased.event_type,
       CASE WHEN octet_length(leased.payload_text) <= $3 THEN leased.payload_text END AS payload,
       octet_length(leased.payload_text) AS payload_bytes,
       leased.attempt_count, leased.lease_token, leased.created_at, leased.ordering_key,
       leased.endpoint_state,
       -- A trace context over telemetry.MAX_TRACE_CONTEXT_CHARS is not fetched: in its place an
       -- object with its length, which the relay warns about and ignores. NULL stays NULL.
       CASE WHEN length(leased.trace_context) <= 4096 THEN leased.trace_context
            WHEN leased.trace_context IS NOT NULL
            THEN json_build_object('outbox_oversize_chars', length(leased.trace_context))::text
       END AS trace_context,
       (SELECT endpoints FROM troubled) AS troubled_endpoints,
       (SELECT extract(epoch FROM now())::float8) AS database_now,
       NULL::bigint AS parked
FROM leased
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       (SELECT endpoints FROM troubled), (SELECT extract(epoch FROM now())::float8), p.parked
FROM (SELECT count(*) AS parked FROM parked) AS p
WHERE p.parked > 0;

-- lease_past --
-- Not a statement: lease_batch's "past" clause, for a lease that reads past the messages of some
-- event types ($5: their endpoints have as much waiting in the relay as they may start now;
-- postgres.lease_past_statement). The due rows in lease_batch's order, at most 10,000 of them (what
-- one lease reads past is bounded), less those of the skipped event types; lease_batch's "due"
-- then takes only these.
past AS (
    SELECT w.outbox_message_id
    FROM (SELECT p.outbox_message_id, p.event_type
          FROM outbox_messages AS p
          WHERE p.status IN ('Pending', 'Processing')
            AND (CASE WHEN p.status = 'Processing'
                      THEN COALESCE(p.lease_expires_at, '-infinity'::timestamptz)
                      ELSE p.next_attempt_at END) <= now()
          ORDER BY (CASE WHEN p.status = 'Processing'
                         THEN COALESCE(p.lease_expires_at, '-infinity'::timestamptz)
                         ELSE p.next_attempt_at END),
                   p.created_at
          LIMIT 10000) AS w
    WHERE w.event_type <> ALL ($5::text[])
),

-- record_outcomes --
-- Write a whole batch of outcomes and their attempt history in one statement. $1…$7 are arrays
-- with one element per message, in the order of OutcomeRow (outcome_rows.py); $8…$17 arrays
-- with one element per attempt (an endpoint's delivery), in the order of AttemptRow; $18 whether a
-- Failed message holds back later messages with its ordering key; $19/$20 the earliest and the
-- latest created_at of the messages (on the partitioned layout only their partitions are read:
-- docs/partitioning.md).
-- Fenced by the lease token: a worker whose lease expired and was re-leased cannot overwrite the
-- newer outcome; its attempts are still kept in the history, with applied = false (unless the
-- message is gone: no attempt outlives its message). Rows released without an attempt get no
-- history. started_epoch (the worker's clock) is for the history only.
-- A keyed message that is done (delivered, or Failed where that does not hold its key) lets the
-- next message of its key go: parked behind it, that one is due now. Returns each applied
-- outcome, and whether it let a next message go that is due now.
WITH o AS (
    SELECT *
    FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::float8[], $5::text[], $6::bool[],
                $7::text[])
         AS o(outbox_message_id, lease_token, status, delay_seconds, last_error, not_attempted,
              endpoint_state)
),
a AS (
    SELECT *
    FROM unnest($8::uuid[], $9::text[], $10::int[], $11::text[], $12::float8[], $13::int[],
                $14::int[], $15::text[], $16::text[], $17::text[])
         AS a(outbox_message_id, endpoint, attempt_number, status, started_epoch, duration_ms,
              http_status, error_class, error, response_snippet)
),
updated AS (
    UPDATE outbox_messages AS m
    SET status = o.status,
        attempt_count = m.attempt_count - CASE WHEN o.not_attempted THEN 1 ELSE 0 END,
        next_attempt_at = CASE WHEN o.status = 'Pending'
                               THEN now() + make_interval(secs => o.delay_seconds)
                               ELSE m.next_attempt_at END,
        processed_at = CASE WHEN o.status = 'Processed' THEN now() END,
        lease_expires_at = NULL,
        last_error = CASE WHEN o.not_attempted THEN m.last_error ELSE o.last_error END,
        endpoint_state = o.endpoint_state::jsonb
    FROM o
    WHERE m.outbox_message_id = o.outbox_message_id
      AND m.created_at BETWEEN $19::timestamptz AND $20::timestamptz
      AND m.status = 'Processing'
      AND m.lease_token = o.lease_token
    RETURNING m.outbox_message_id, m.status, m.ordering_key, m.ordering_seq
),
next_in_key AS (
    SELECT u.outbox_message_id AS after, n.outbox_message_id, n.next_attempt_at
    FROM updated AS u
    CROSS JOIN LATERAL (
        SELECT n.outbox_message_id, n.status, n.next_attempt_at
        FROM outbox_messages AS n
        WHERE n.ordering_key = u.ordering_key
          AND n.ordering_seq > u.ordering_seq
          AND n.status <> 'Processed'
          AND (n.status <> 'Failed' OR $18::bool)
        ORDER BY n.ordering_seq
        LIMIT 1
    ) AS n
    WHERE u.ordering_key IS NOT NULL
      AND (u.status = 'Processed' OR (u.status = 'Failed' AND NOT $18::bool))
      AND n.status = 'Pending'
),
let_go AS (
    UPDATE outbox_messages AS m
    SET next_attempt_at = now()
    FROM next_in_key
    WHERE m.outbox_message_id = next_in_key.outbox_message_id
      AND m.status = 'Pending'
      AND m.next_attempt_at = 'infinity'
    RETURNING m.outbox_message_id
),
kept AS (
    -- The messages of stale outcomes that still exist, locked as a foreign key's check would:
    -- an attempt is recorded only with its message (none for a message deleted meanwhile).
    SELECT m.outbox_message_id
    FROM outbox_messages AS m
    WHERE m.outbox_message_id = ANY (ARRAY(
        SELECT o.outbox_message_id
        FROM o
        WHERE NOT EXISTS (
            SELECT 1 FROM updated AS u WHERE u.outbox_message_id = o.outbox_message_id)))
      AND m.created_at BETWEEN $19::timestamptz AND $20::timestamptz
    FOR KEY SHARE OF m
),
history AS (
    INSERT INTO outbox_attempts
        (outbox_message_id, attempt_number, lease_token, started_at, finished_at, duration_ms,
         outcome, applied, http_status, error_class, error, response_snippet, endpoint)
    SELECT a.outbox_message_id, a.attempt_number, o.lease_token, to_timestamp(a.started_epoch),
           to_timestamp(a.started_epoch + a.duration_ms / 1000.0), a.duration_ms,
           a.status, updated.outbox_message_id IS NOT NULL, a.http_status, a.error_class,
           a.error, a.response_snippet, a.endpoint
    FROM a
    JOIN o ON o.outbox_message_id = a.outbox_message_id
    LEFT JOIN updated ON updated.outbox_message_id = a.outbox_message_id
    WHERE updated.outbox_message_id IS NOT NULL
       OR a.outbox_message_id IN (SELECT outbox_message_id FROM kept)
)
SELECT u.outbox_message_id,
       COALESCE(n.next_attempt_at = 'infinity' OR n.next_attempt_at <= now(), false)
           AS lets_next_go
FROM updated AS u
LEFT JOIN next_in_key AS n ON n.after = u.outbox_message_id;

-- record_delivered --
-- record_outcomes for the usual batch: every message was answered 2xx by each endpoint of its
-- event type, with nothing kept from before (endpoint_state NULL), so every outcome is Processed.
-- The same rows written from fewer arrays: $1 ids and $2 lease tokens, one element per message;
-- $3…$8 one element per attempt, in the order of SentAttempt; $9 as $18 of record_outcomes,
-- $10/$11 as its $19/$20.
-- Fenced by the lease token and keeping every attempt, as record_outcomes does. Returns one row:
-- the ids whose outcome was not applied (stale), and whether an applied one let the next message
-- of its ordering key go, due now.
WITH o AS (
    SELECT *
    FROM unnest($1::uuid[], $2::uuid[]) AS o(outbox_message_id, lease_token)
),
a AS (
    SELECT *
    FROM unnest($3::uuid[], $4::text[], $5::int[], $6::float8[], $7::int[], $8::int[])
         AS a(outbox_message_id, endpoint, attempt_number, started_epoch, duration_ms,
              http_status)
),
updated AS (
    UPDATE outbox_messages AS m
    SET status = 'Processed',
        processed_at = now(),
        lease_expires_at = NULL,
        last_error = NULL,
        endpoint_state = NULL
    FROM o
    WHERE m.outbox_message_id = o.outbox_message_id
      AND m.created_at BETWEEN $10::timestamptz AND $11::timestamptz
      AND m.status = 'Processing'
      AND m.lease_token = o.lease_token
    RETURNING m.outbox_message_id, m.ordering_key, m.ordering_seq
),
next_in_key AS (
    SELECT n.outbox_message_id, n.next_attempt_at
    FROM updated AS u
    CROSS JOIN LATERAL (
        SELECT n.outbox_message_id, n.status, n.next_attempt_at
        FROM outbox_messages AS n
        WHERE n.ordering_key = u.ordering_key
          AND n.ordering_seq > u.ordering_seq
          AND n.status <> 'Processed'
          AND (n.status <> 'Failed' OR $9::bool)
        ORDER BY n.ordering_seq
        LIMIT 1
    ) AS n
    WHERE u.ordering_key IS NOT NULL
      AND n.status = 'Pending'
),
let_go AS (
    UPDATE outbox_messages AS m
    SET next_attempt_at = now()
    FROM next_in_key
    WHERE m.outbox_message_id = next_in_key.outbox_message_id
      AND m.status = 'Pending'
      AND m.next_attempt_at = 'infinity'
    RETURNING m.outbox_message_id
),
stale AS (
    SELECT o.outbox_message_id
    FROM o
    WHERE NOT EXISTS (SELECT 1 FROM updated AS u WHERE u.outbox_message_id = o.outbox_message_id)
),
kept AS (
    -- As in record_outcomes: a stale attempt is recorded only while its message exists.
    SELECT m.outbox_message_id
    FROM outbox_messages AS m
    WHERE m.outbox_message_id = ANY (ARRAY(SELECT outbox_message_id FROM stale))
    FOR KEY SHARE OF m
),
history AS (
    INSERT INTO outbox_attempts
        (outbox_message_id, attempt_number, lease_token, started_at, finished_at, duration_ms,
         outcome, applied, http_status, endpoint)
    SELECT a.outbox_message_id, a.attempt_number, o.lease_token, to_timestamp(a.started_epoch),
           to_timestamp(a.started_epoch + a.duration_ms / 1000.0), a.duration_ms,
           'Processed', updated.outbox_message_id IS NOT NULL, a.http_status, a.endpoint
    FROM a
    JOIN o ON o.outbox_message_id = a.outbox_message_id
    LEFT JOIN updated ON updated.outbox_message_id = a.outbox_message_id
    WHERE updated.outbox_message_id IS NOT NULL
       OR a.outbox_message_id IN (SELECT outbox_message_id FROM kept)
)
SELECT ARRAY(SELECT outbox_message_id FROM stale) AS stale,
       EXISTS (
           SELECT 1
           FROM next_in_key AS n
           WHERE n.next_attempt_at = 'infinity' OR n.next_attempt_at <= now()
       ) AS lets_next_go;

-- release_held --
-- Let go parked messages whose wait is over although nothing let them go: the message before
-- them was deleted or changed by hand, or OUTBOX_ORDERING_ON_FAILURE became release. Reads the
-- first parked message of each key only (held index); $1 as in lease_batch.
WITH RECURSIVE held_keys AS (
    (SELECT ordering_key FROM outbox_messages
      WHERE next_attempt_at = 'infinity' AND ordering_key IS NOT NULL
      ORDER BY ordering_key LIMIT 1)
    UNION ALL
    SELECT (SELECT k.ordering_key FROM outbox_messages AS k
             WHERE k.next_attempt_at = 'infinity' AND k.ordering_key > h.ordering_key
             ORDER BY k.ordering_key LIMIT 1)
    FROM held_keys AS h
    WHERE h.ordering_key IS NOT NULL
),
first_held AS (
    SELECT f.outbox_message_id, f.ordering_key, f.ordering_seq
    FROM held_keys AS h
    CROSS JOIN LATERAL (
        SELECT p.outbox_message_id, p.ordering_key, p.ordering_seq
        FROM outbox_messages AS p
        WHERE p.next_attempt_at = 'infinity' AND p.ordering_key = h.ordering_key
        ORDER BY p.ordering_seq
        LIMIT 1
    ) AS f
    WHERE h.ordering_key IS NOT NULL
),
wait_over AS (
    SELECT f.outbox_message_id
    FROM first_held AS f
    WHERE NOT EXISTS (
        SELECT 1
        FROM outbox_messages AS e
        WHERE e.ordering_key = f.ordering_key
          AND e.ordering_seq < f.ordering_seq
          AND e.status <> 'Processed'
          AND (e.status <> 'Failed' OR $1::bool)
    )
)
UPDATE outbox_messages AS m
SET next_attempt_at = now()
FROM wait_over
WHERE m.outbox_message_id = wait_over.outbox_message_id
  AND m.status = 'Pending'
  AND m.next_attempt_at = 'infinity'
RETURNING m.outbox_message_id;

-- notify_wakeup --
-- A wake-up over PostgreSQL (OUTBOX_WAKEUP=postgres): each `outbox serve` LISTENing drains. Sent
-- after the business transaction's commit, in a transaction of its own:
-- docs/performance.md#wake-ups-over-postgresql
SELECT pg_notify('outbox_wakeup', '');

-- notify_queue_usage --
-- The fraction of PostgreSQL's NOTIFY queue (one per server, every channel's) taken by
-- notifications some LISTENing session has not read yet; NOTIFY fails once it is full. A session
-- that LISTENs and stays idle in a transaction holds everything sent after it began.
SELECT pg_notification_queue_usage()::float8 AS usage;

-- ping --
-- Whether a connection still answers (the LISTENing one of OUTBOX_WAKEUP=postgres, /readyz).
SELECT 1;

-- next_due_in --
-- Seconds until the next Pending message comes due (a retry, a Retry-After), if one is waiting
-- for a time to come; parked ones wait for another message, not a time. The first such row of
-- the due index after now().
SELECT extract(epoch FROM (CASE WHEN status = 'Processing'
                                THEN COALESCE(lease_expires_at, '-infinity'::timestamptz)
                                ELSE next_attempt_at END) - now())::float8 AS due_in
FROM outbox_messages
WHERE status IN ('Pending', 'Processing')
  AND (CASE WHEN status = 'Processing'
            THEN COALESCE(lease_expires_at, '-infinity'::timestamptz)
            ELSE next_attempt_at END) > now()
  AND (CASE WHEN status = 'Processing'
            THEN COALESCE(lease_expires_at, '-infinity'::timestamptz)
            ELSE next_attempt_at END) < 'infinity'::timestamptz
  AND status = 'Pending'
ORDER BY (CASE WHEN status = 'Processing'
               THEN COALESCE(lease_expires_at, '-infinity'::timestamptz)
               ELSE next_attempt_at END)
LIMIT 1;

-- outcomes_written --
-- Before an outcome write is retried after a lost reply: did it commit after all? $1 ids, $2 the
-- lease tokens. The write is one statement, so it committed whole or not at all; applied lists the
-- outcomes it applied (still ours: not Processing, same token), written whether it left any trace.
WITH o AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[]) AS o(outbox_message_id, lease_token)
)
SELECT
    ARRAY(
        SELECT m.outbox_message_id
        FROM o
        JOIN outbox_messages AS m ON m.outbox_message_id = o.outbox_message_id
        WHERE m.lease_token = o.lease_token AND m.status <> 'Processing'
    ) AS applied,
    EXISTS (
        SELECT 1
        FROM o
        JOIN outbox_attempts AS a
          ON a.outbox_message_id = o.outbox_message_id AND a.lease_token = o.lease_token
    ) AS written;

-- endpoints_tried --
-- The endpoints that the attempt history says each of messages $1 was sent to (NULL: an attempt
-- made before endpoints were named); a message with no attempt recorded has no row
SELECT outbox_message_id, array_agg(DISTINCT endpoint) AS endpoints
FROM outbox_attempts
WHERE outbox_message_id = ANY ($1::uuid[])
GROUP BY outbox_message_id;

-- create_migrations_table --
-- Bookkeeping for `python -m outbox migrate`: one row per applied migration file, in {table}
-- (outbox_migrations; the consumer inbox's set apart, in outbox_inbox_migrations, as a
-- consumer's database may hold both and each set is numbered on its own)
CREATE TABLE IF NOT EXISTS {table} (
    name       text        PRIMARY KEY,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- lock_migrations --
-- Serialise concurrent migrators of one set ($1: its key, the name of its table) for the whole
-- session (released by unlock_migrations): true if this session took the lock. Tried, not
-- waited for: a migrator waiting inside a statement would hold a snapshot that CREATE INDEX
-- CONCURRENTLY, run by the holder, waits for.
SELECT pg_try_advisory_lock(hashtext($1));

-- unlock_migrations --
-- Release the migrators' lock ($1: the set's key)
SELECT pg_advisory_unlock(hashtext($1));

-- applied_migrations --
-- Migrations already applied, with the checksum they had
SELECT name, checksum FROM {table} ORDER BY name;

-- record_migration --
-- Remember that a migration file was applied
INSERT INTO {table} (name, checksum) VALUES ($1, $2);

-- show_lock_timeout --
-- The session's lock_timeout, put back once the migrations are applied
SELECT current_setting('lock_timeout');

-- set_lock_timeout --
-- How long a migration's statement waits for a lock ($1, e.g. '2s') before it gives up
SELECT set_config('lock_timeout', $1, false);

-- lock_holders --
-- Other sessions holding a lock on an outbox table or index, oldest transaction first: what a
-- migration that could not take its lock waits for (the statement was cancelled, so
-- pg_blocking_pids has nothing to say any more). No query text: it may hold a customer's data
SELECT a.pid, a.application_name, a.xact_start,
       floor(extract(epoch FROM now() - a.xact_start))::integer AS seconds
FROM pg_stat_activity AS a
WHERE a.pid <> pg_backend_pid()
  AND a.xact_start IS NOT NULL
  AND a.pid IN (
      SELECT l.pid
      FROM pg_locks AS l
      JOIN pg_class AS c ON c.oid = l.relation
      WHERE l.granted
        AND l.locktype = 'relation'
        AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
        AND c.relnamespace = current_schema()::regnamespace
        AND c.relname LIKE 'outbox\_%')
ORDER BY a.xact_start
LIMIT 3;

-- lock_holders_remaining --
-- How many of the transactions a migration waits for ($1 pids, $2 their xact_start) are still open
SELECT count(*)
FROM pg_stat_activity AS a
JOIN unnest($1::integer[], $2::timestamptz[]) AS h(pid, xact_start)
  ON a.pid = h.pid AND a.xact_start = h.xact_start;

-- invalid_index --
-- The index named $1 if a CREATE INDEX CONCURRENTLY that failed left it INVALID (quoted, qualified
-- as needed), else nothing
SELECT i.indexrelid::regclass::text
FROM pg_index AS i
WHERE i.indexrelid = to_regclass($1) AND NOT i.indisvalid;

-- relation_kind --
-- The kind of relation $1 ('r' a table, 'p' a partitioned one, 'i' an index, 'I' a partitioned
-- index), else nothing
SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1);

-- index_valid --
-- Whether index $1 is valid (a partitioned index: once every partition has one attached)
SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1);

-- partitions_without_index --
-- The leaf partitions (their names) of the partitioned table $1 that have no index attached to
-- its partitioned index $2
SELECT c.relname
FROM pg_partition_tree(to_regclass($1)) AS t
JOIN pg_class AS c ON c.oid = t.relid
WHERE t.isleaf
  AND NOT EXISTS (SELECT 1
                  FROM pg_inherits AS h
                  JOIN pg_index AS x ON x.indexrelid = h.inhrelid
                  WHERE h.inhparent = to_regclass($2) AND x.indrelid = t.relid)
ORDER BY c.relname;

-- database_exists --
-- Whether a database of this name ($1) exists on the server (make run's embedded PostgreSQL)
SELECT 1 FROM pg_database WHERE datname = $1;

-- endpoint_failed --
-- A relay saw $3 retryable failures in a row at endpoint ($1 event type, $2 name): count them,
-- and open its breaker once they reach $4 (or at once when $5, a failed probe), unless it is
-- open already: closed to deliveries for $6 s, doubling with each opening in a row, at most
-- $7 s. While open, the endpoint's due messages that wait for nothing else (their other
-- endpoints, $8, done) are pushed to when it reopens, so that leases stop taking them.
-- Returns the seconds until it reopens (NULL: it is closed).
WITH counted AS (
    INSERT INTO outbox_endpoints AS e
        (event_type, endpoint, consecutive_failures, opens, opened_at, reopen_at, updated_at)
    VALUES ($1::text, $2::text, $3::int,
            CASE WHEN $3::int >= $4::int OR $5::bool THEN 1 ELSE 0 END,
            CASE WHEN $3::int >= $4::int OR $5::bool THEN now() END,
            CASE WHEN $3::int >= $4::int OR $5::bool
                 THEN now() + make_interval(secs => $6::float8) END,
            now())
    ON CONFLICT (event_type, endpoint) DO UPDATE
    SET consecutive_failures = e.consecutive_failures + $3::int,
        opens = CASE WHEN (e.consecutive_failures + $3::int >= $4::int OR $5::bool)
                          AND (e.reopen_at IS NULL OR e.reopen_at <= now())
                     THEN e.opens + 1 ELSE e.opens END,
        opened_at = CASE WHEN e.consecutive_failures + $3::int >= $4::int OR $5::bool
                         THEN COALESCE(e.opened_at, now()) ELSE e.opened_at END,
        reopen_at = CASE WHEN (e.consecutive_failures + $3::int >= $4::int OR $5::bool)
                              AND (e.reopen_at IS NULL OR e.reopen_at <= now())
                         THEN now() + make_interval(
                             secs => least($6::float8 * power(2, e.opens), $7::float8))
                         ELSE e.reopen_at END,
        probe_until = CASE WHEN $5::bool THEN NULL ELSE e.probe_until END,
        updated_at = now()
    RETURNING e.reopen_at
),
pushed AS (
    UPDATE outbox_messages AS m
    SET next_attempt_at = counted.reopen_at
    FROM counted
    WHERE counted.reopen_at > now()
      AND m.event_type = $1::text
      AND m.status = 'Pending'
      AND m.next_attempt_at < counted.reopen_at
      AND NOT EXISTS (
            SELECT 1 FROM unnest($8::text[]) AS other(name)
            WHERE COALESCE(m.endpoint_state -> other.name ->> 'status', 'Pending') = 'Pending')
    RETURNING m.outbox_message_id
)
SELECT extract(epoch FROM reopen_at - now())::float8 AS reopen_in,
       (SELECT count(*) FROM pushed) AS pushed
FROM counted;

-- endpoint_recovered --
-- Endpoint ($1, $2) answered: its breaker closes and its count of failures starts again.
DELETE FROM outbox_endpoints WHERE event_type = $1 AND endpoint = $2;

-- claim_probe --
-- Endpoint ($1, $2)'s cool-down is over: the first relay to ask sends the one probe request
-- that decides, and holds the claim for $3 s (its timeout); true if this one got it.
UPDATE outbox_endpoints
SET probe_until = now() + make_interval(secs => $3), updated_at = now()
WHERE event_type = $1 AND endpoint = $2
  AND reopen_at <= now()
  AND (probe_until IS NULL OR probe_until <= now())
RETURNING true AS claimed;

-- paused_endpoint_keys --
-- The endpoints paused by hand, as a run reads them while it delivers (about once a second)
SELECT event_type, endpoint FROM outbox_paused_endpoints;

-- lock_limits --
-- One relay at a time starts from the endpoints' learned limits (migration 0023): held until the
-- transaction ends, so that a relay starting meanwhile reads what this one starts from.
SELECT pg_advisory_xact_lock(hashtextextended('outbox_endpoint_limits', 0));

-- forget_limits --
-- Forget the limits no relay will read: rows not written within $1 s (their relay is gone or
-- idle) unless they are their endpoint's latest learned one, and any row older than a week.
DELETE FROM outbox_endpoint_limits AS l
WHERE l.updated_at < now() - make_interval(secs => $1::float8)
  AND (l.updated_at < now() - interval '7 days'
       OR NOT l.learned
       OR EXISTS (SELECT 1 FROM outbox_endpoint_limits AS n
                  WHERE n.event_type = l.event_type AND n.endpoint = l.endpoint
                    AND n.learned AND n.updated_at > l.updated_at));

-- learned_limits --
-- What the other relays (all but $3) keep of the limits of endpoints ($1 event types, $2 names),
-- with their ages by the database's clock
SELECT l.event_type, l.endpoint, l.concurrency, l.settled,
       extract(epoch FROM now() - l.updated_at)::float8 AS age,
       extract(epoch FROM now() - l.pushed_back_at)::float8 AS pushed_back_ago,
       l.learned
FROM outbox_endpoint_limits AS l
JOIN unnest($1::text[], $2::text[]) AS k(event_type, endpoint)
  ON l.event_type = k.event_type AND l.endpoint = k.endpoint
WHERE l.relay <> $3::uuid;

-- save_limits --
-- Keep relay $1's limits of endpoints ($2 event types, $3 names, $4 limits, $5 where their last
-- push-back left them, $6 seconds since it, $7 learned from answers): one row per endpoint and
-- relay, written over. At most one such write per relay every few seconds (relay/limit_store.py).
INSERT INTO outbox_endpoint_limits AS l
    (event_type, endpoint, relay, concurrency, settled, pushed_back_at, learned, updated_at)
SELECT k.event_type, k.endpoint, $1::uuid, k.concurrency, k.settled,
       now() - make_interval(secs => k.pushed_back_ago), k.learned, now()
FROM unnest($2::text[], $3::text[], $4::float8[], $5::float8[], $6::float8[], $7::boolean[])
    AS k(event_type, endpoint, concurrency, settled, pushed_back_ago, learned)
ON CONFLICT (event_type, endpoint, relay) DO UPDATE
SET concurrency = excluded.concurrency,
    settled = excluded.settled,
    pushed_back_at = excluded.pushed_back_at,
    learned = excluded.learned,
    updated_at = excluded.updated_at;
