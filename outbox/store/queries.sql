-- Every statement the relay runs, each under a name that store.py calls it by.
-- Values are always bound parameters.
--
-- The fast paths: shapes kept for a measured gain, each justified in docs/performance.md.
-- * lease_batch's LIMIT $4: the relay writes its usual batch size in (store.lease_statement), so
--   the lease is planned once per connection:
--   docs/performance.md#the-leases-batch-size-in-its-sql
-- * lease_batch, lease_past and next_due_in spell the due time's CASE exactly as the partial
--   indexes outbox_messages_due_idx and outbox_messages_due_unkeyed_idx do; change one, change all:
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
-- outbox_message_ids first on the partitioned one (outbox/store/partitions.py).
SELECT outbox_insert_message($1, $2, $3::jsonb, $4::text, $5::jsonb) AS outbox_message_id;

-- insert_new_message --
-- insert_message for an id the producer generated (a random UUID, never in the table): without
-- ON CONFLICT, whose speculative insertion writes one more WAL record per message.
INSERT INTO outbox_messages
    (outbox_message_id, event_type, payload, status, next_attempt_at, ordering_key, ordering_seq,
     trace_context)
VALUES ($1, $2, $3::jsonb, 'Pending', now(), $4::text,
        CASE WHEN $4::text IS NOT NULL THEN nextval('outbox_messages_ordering_seq') END,
        $5::jsonb)
RETURNING outbox_message_id;

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
-- relay writes its usual batch size in instead, store.lease_statement: no parameter then changes
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
    -- rows without a key, from their own index (outbox_messages_due_unkeyed_idx), which rows
    -- behind held keys, however many and however old, never enter.
    SELECT m.outbox_message_id, m.created_at,
           (CASE WHEN m.status = 'Processing'
                 THEN COALESCE(m.lease_expires_at, '-infinity'::timestamptz)
                 ELSE m.next_attempt_at END) AS due_at
    FROM outbox_messages AS m
    WHERE EXISTS (SELECT 1 FROM due WHERE due.waits_for IS NOT NULL)
      AND m.ordering_key IS NULL
      AND m.status IN ('Pending', 'Processing')
      AND (CASE WHEN m.status = 'Processing'
                THEN COALESCE(m.lease_expires_at, '-infinity'::timestamptz)
                ELSE m.next_attempt_at END) <= now()
    ORDER BY (CASE WHEN m.status = 'Processing'
                   THEN COALESCE(m.lease_expires_at, '-infinity'::timestamptz)
                   ELSE m.next_attempt_at END),
             m.created_at
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
-- store.lease_past_statement). The due rows in lease_batch's order, at most 10,000 of them (what
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
-- with one element per message, in the order of store.OutcomeRow; $8…$17 arrays with one
-- element per attempt (an endpoint's delivery), in the order of store.AttemptRow; $18 whether a
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
-- $3…$8 one element per attempt, in the order of store.SentAttempt; $9 as $18 of record_outcomes,
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

-- backlog_status --
-- Health of the backlog: counts by status and the ages an on-call engineer alerts on. Processed
-- rows are counted up to $1 (NULL: all of them; the console counts a bounded number, then
-- estimates from the table's row estimate, estimated_rows, which VACUUM and ANALYZE keep).
SELECT
    (SELECT count(*) FROM outbox_messages WHERE status = 'Pending') AS pending,
    (SELECT count(*) FROM outbox_messages WHERE status = 'Processing') AS processing,
    (SELECT count(*)
       FROM (SELECT 1 FROM outbox_messages WHERE status = 'Processed' LIMIT $1::bigint) AS p
    ) AS processed,
    -- On the partitioned layout, the partitions' estimates (autovacuum analyses no parent).
    (SELECT sum(GREATEST(c.reltuples, 0))::bigint FROM pg_class AS c
      WHERE c.oid = to_regclass('outbox_messages') AND c.relkind = 'r'
         OR c.oid IN (SELECT inhrelid FROM pg_inherits
                      WHERE inhparent = to_regclass('outbox_messages'))) AS estimated_rows,
    (SELECT count(*) FROM outbox_messages WHERE status = 'Failed') AS failed,
    (SELECT extract(epoch FROM now() - min(created_at))::float8
       FROM outbox_messages
      WHERE status = 'Pending' AND next_attempt_at <= now()) AS oldest_due_pending_age_seconds,
    (SELECT extract(epoch FROM now() - min(created_at))::float8
       FROM outbox_messages
      WHERE status IN ('Pending', 'Processing')) AS oldest_unpublished_age_seconds,
    (SELECT extract(epoch FROM now() - min(created_at))::float8
       FROM outbox_messages
      WHERE status = 'Failed') AS oldest_failed_age_seconds,
    (SELECT count(*)
       FROM outbox_messages
      WHERE status = 'Processing'
        AND (lease_expires_at IS NULL OR lease_expires_at <= now())) AS expired_leases,
    (SELECT count(*)
       FROM outbox_messages
      WHERE next_attempt_at = 'infinity' AND ordering_key IS NOT NULL) AS held_back,
    -- The layout: only the partitioned one is described further (partitions.describe).
    COALESCE((SELECT relkind = 'p' FROM pg_class
               WHERE oid = to_regclass('outbox_messages')), false) AS partitioned,
    extract(epoch FROM clock_timestamp())::float8 AS database_now;

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
    -- on the partitioned layout (store.postgres._requeue_batch).
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

-- create_migrations_table --
-- Bookkeeping for `python -m outbox migrate`: one row per applied migration file
CREATE TABLE IF NOT EXISTS outbox_migrations (
    name       text        PRIMARY KEY,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- lock_migrations --
-- Serialise concurrent migrators for the whole session (released by unlock_migrations): true if
-- this session took the lock. Tried, not waited for: a migrator waiting inside a statement
-- would hold a snapshot that CREATE INDEX CONCURRENTLY, run by the holder, waits for.
SELECT pg_try_advisory_lock(hashtext('outbox_migrations'));

-- unlock_migrations --
-- Release the migrators' lock
SELECT pg_advisory_unlock(hashtext('outbox_migrations'));

-- applied_migrations --
-- Migrations already applied, with the checksum they had
SELECT name, checksum FROM outbox_migrations ORDER BY name;

-- record_migration --
-- Remember that a migration file was applied
INSERT INTO outbox_migrations (name, checksum) VALUES ($1, $2);

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

-- create_inbox_migrations_table --
-- Bookkeeping for `python -m outbox migrate --inbox`, apart from the relay's: a consumer's
-- database may hold both, and each set is numbered on its own
CREATE TABLE IF NOT EXISTS outbox_inbox_migrations (
    name       text        PRIMARY KEY,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- lock_inbox_migrations --
-- Serialise concurrent inbox migrators for the whole session (a key of their own), as
-- lock_migrations does: true if this session took the lock.
SELECT pg_try_advisory_lock(hashtext('outbox_inbox_migrations'));

-- unlock_inbox_migrations --
-- Release the inbox migrators' lock
SELECT pg_advisory_unlock(hashtext('outbox_inbox_migrations'));

-- applied_inbox_migrations --
-- Inbox migrations already applied, with the checksum they had
SELECT name, checksum FROM outbox_inbox_migrations ORDER BY name;

-- record_inbox_migration --
-- Remember that an inbox migration file was applied
INSERT INTO outbox_inbox_migrations (name, checksum) VALUES ($1, $2);

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
-- Not a statement: the clause the console's list reads from (store.console_statement), the newest
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

-- console_messages --
-- One page of the console's message list, newest first, keyset-paged on (created_at, id): of the
-- rows console_scanned reads (spliced in for "console_scanned" by store.console_statement), those
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
-- The latest $1 Failed messages (outbox_messages_failed_order_idx) grouped by the head of their
-- last_error ("HTTP 503", "no endpoint configured for event type 'X'", "gave up after 3
-- attempts: HTTP 500"): each reason with its count and one message's id, most frequent first
WITH latest AS (
    SELECT outbox_message_id, event_type,
           btrim(regexp_replace(left(COALESCE(last_error, '(no error recorded)'), 200),
                                '^((gave up after [0-9]+ attempts: )?[^:(]*).*$', '\1')) AS reason
    FROM outbox_messages
    WHERE status = 'Failed'
    ORDER BY created_at DESC, outbox_message_id DESC
    LIMIT $1
)
SELECT reason, count(*) AS messages, array_agg(DISTINCT event_type) AS event_types
FROM latest
GROUP BY reason
ORDER BY count(*) DESC, reason
LIMIT 20;

-- console_held_keys --
-- Ordering keys with messages parked behind an earlier one (next_attempt_at = 'infinity', read
-- from outbox_messages_due_idx), the most held first, at most 20
SELECT ordering_key, count(*) AS held
FROM outbox_messages
WHERE status IN ('Pending', 'Processing')
  AND next_attempt_at = 'infinity'
  AND ordering_key IS NOT NULL
GROUP BY ordering_key
ORDER BY count(*) DESC, ordering_key
LIMIT 20;

-- paused_endpoints --
-- The endpoints paused by hand, for status and the console
SELECT event_type, endpoint, paused_at, paused_by
FROM outbox_paused_endpoints
ORDER BY event_type, endpoint;

-- paused_endpoint_keys --
-- The endpoints paused by hand, as a run reads them while it delivers (about once a second)
SELECT event_type, endpoint FROM outbox_paused_endpoints;

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
-- dry run, $5 the key's identity. A row back: this one does it; none: it was taken already.
INSERT INTO outbox_console_actions (action_id, action, filter, dry_run, actor)
VALUES ($1, $2, $3::jsonb, $4, $5)
ON CONFLICT (action_id) DO NOTHING
RETURNING created_at;

-- finish_action --
-- Action $1 done: how many rows it touched ($2) and its result ($3)
UPDATE outbox_console_actions SET affected = $2, result = $3::jsonb WHERE action_id = $1;

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
-- The latest $1 recorded actions, newest first
SELECT action_id, action, filter::text AS filter, affected, dry_run, actor, created_at,
       result::text AS result
FROM outbox_console_actions
ORDER BY created_at DESC, action_id
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
