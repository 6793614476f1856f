-- Every statement the relay runs, each under a name that store.py calls it by.
-- Values are always bound parameters.

-- insert_message --
-- Add a Pending row, due now, inside the caller's transaction; returns nothing when the id exists.
-- $4 is the optional ordering key: keyed rows also take their place in the ordering sequence.
INSERT INTO outbox_messages
    (outbox_message_id, event_type, payload, status, next_attempt_at, ordering_key, ordering_seq)
VALUES ($1, $2, $3::jsonb, 'Pending', now(), $4::text,
        CASE WHEN $4::text IS NOT NULL THEN nextval('outbox_messages_ordering_seq') END)
ON CONFLICT (outbox_message_id) DO NOTHING
RETURNING outbox_message_id;

-- lease_batch --
-- Claim due Pending rows and rows whose lease expired; $1 = batch size, $2 = lease seconds,
-- $3 = whether a Failed message holds back later messages with its ordering key,
-- $4 = the largest payload to return: a bigger one (only a row written by hand can be) comes back
-- as NULL with its size, so a batch of them cannot fill the relay's memory.
-- While a row is Processing its next_attempt_at equals lease_expires_at, so the partial index
-- (next_attempt_at, created_at) serves both halves of the seed's condition in one ordered scan.
-- A Processing row without any lease (set by hand) belongs to no worker: it is claimable too.
-- A keyed row is due only when no earlier row with its key is still waiting (ordering index).
WITH due AS (
    SELECT m.outbox_message_id
    FROM outbox_messages AS m
    WHERE m.status IN ('Pending', 'Processing')
      AND m.next_attempt_at <= now()
      AND (m.status = 'Pending' OR m.lease_expires_at IS NULL OR m.lease_expires_at <= now())
      AND (m.ordering_key IS NULL OR NOT EXISTS (
            SELECT 1
            FROM outbox_messages AS earlier
            WHERE earlier.ordering_key = m.ordering_key
              AND earlier.ordering_seq < m.ordering_seq
              AND earlier.status <> 'Processed'
              AND (earlier.status <> 'Failed' OR $3::bool)))
    ORDER BY m.next_attempt_at, m.created_at
    FOR UPDATE OF m SKIP LOCKED
    LIMIT $1
),
leased AS (
    UPDATE outbox_messages AS m
    SET status = 'Processing',
        attempt_count = m.attempt_count + 1,
        processing_started_at = now(),
        lease_expires_at = now() + make_interval(secs => $2),
        next_attempt_at = now() + make_interval(secs => $2),
        lease_token = gen_random_uuid()
    FROM due
    WHERE m.outbox_message_id = due.outbox_message_id
    RETURNING m.outbox_message_id, m.event_type, m.payload::text AS payload_text,
              m.attempt_count, m.lease_token, m.created_at, m.ordering_key
)
-- The payload is turned into text once per row (RETURNING cannot share an expression).
SELECT outbox_message_id, event_type,
       CASE WHEN octet_length(payload_text) <= $4 THEN payload_text END AS payload,
       octet_length(payload_text) AS payload_bytes,
       attempt_count, lease_token, created_at, ordering_key
FROM leased;

-- successors_due --
-- Whether a message with one of these ordering keys ($1) is due: a hint's run that finished the
-- one before it leases once more for it (its own hint may have found it held back).
SELECT EXISTS (
    SELECT 1
    FROM outbox_messages
    WHERE ordering_key = ANY($1::text[])
      AND status = 'Pending'
      AND next_attempt_at <= now()
) AS due;

-- record_outcomes --
-- Write a whole batch of outcomes and their attempt history in one statement. $1…$12 are arrays,
-- one element per record, in the order of the column list below (store.OutcomeRow).
-- Fenced by the lease token: a worker whose lease expired and was re-leased cannot overwrite the
-- newer outcome; its attempt is still kept in the history, with applied = false. Rows released
-- without an attempt get no history. started_epoch (the worker's clock) is for the history only.
WITH o AS (
    SELECT *
    FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::float8[], $5::text[], $6::bool[],
                $7::int[], $8::float8[], $9::int[], $10::int[], $11::text[], $12::text[])
         AS o(outbox_message_id, lease_token, status, delay_seconds, last_error, not_attempted,
              attempt_number, started_epoch, duration_ms, http_status, error_class,
              response_snippet)
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
        last_error = CASE WHEN o.not_attempted THEN m.last_error ELSE o.last_error END
    FROM o
    WHERE m.outbox_message_id = o.outbox_message_id
      AND m.status = 'Processing'
      AND m.lease_token = o.lease_token
    RETURNING m.outbox_message_id
),
history AS (
    INSERT INTO outbox_attempts
        (outbox_message_id, attempt_number, lease_token, started_at, finished_at, duration_ms,
         outcome, applied, http_status, error_class, error, response_snippet)
    SELECT o.outbox_message_id, o.attempt_number, o.lease_token, to_timestamp(o.started_epoch),
           to_timestamp(o.started_epoch + o.duration_ms / 1000.0), o.duration_ms,
           o.status, updated.outbox_message_id IS NOT NULL, o.http_status, o.error_class,
           o.last_error, o.response_snippet
    FROM o
    LEFT JOIN updated ON updated.outbox_message_id = o.outbox_message_id
    WHERE NOT o.not_attempted
)
SELECT outbox_message_id FROM updated;

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

-- present --
-- Which of these messages ($1) still exist (an outcome write met one that was deleted)
SELECT outbox_message_id FROM outbox_messages WHERE outbox_message_id = ANY ($1::uuid[]);

-- backlog_status --
-- Health of the backlog: counts by status and the ages an on-call engineer alerts on
SELECT
    (SELECT count(*) FROM outbox_messages WHERE status = 'Pending') AS pending,
    (SELECT count(*) FROM outbox_messages WHERE status = 'Processing') AS processing,
    (SELECT count(*) FROM outbox_messages WHERE status = 'Processed') AS processed,
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
        AND (lease_expires_at IS NULL OR lease_expires_at <= now())) AS expired_leases;

-- requeue_failed --
-- Put Failed rows back to Pending, due now, with a fresh attempt budget; history is kept.
-- Each filter applies when it is not NULL: $1 ids, $2 event type, $3/$4 created_at range [from, to).
UPDATE outbox_messages
SET status = 'Pending',
    next_attempt_at = now(),
    attempt_count = 0,
    lease_expires_at = NULL,
    processed_at = NULL
WHERE status = 'Failed'
  AND ($1::uuid[] IS NULL OR outbox_message_id = ANY ($1::uuid[]))
  AND ($2::text IS NULL OR event_type = $2::text)
  AND ($3::timestamptz IS NULL OR created_at >= $3::timestamptz)
  AND ($4::timestamptz IS NULL OR created_at < $4::timestamptz)
RETURNING outbox_message_id;

-- count_failed --
-- What requeue_failed would touch, without touching it (the dry run); same parameters
SELECT outbox_message_id
FROM outbox_messages
WHERE status = 'Failed'
  AND ($1::uuid[] IS NULL OR outbox_message_id = ANY ($1::uuid[]))
  AND ($2::text IS NULL OR event_type = $2::text)
  AND ($3::timestamptz IS NULL OR created_at >= $3::timestamptz)
  AND ($4::timestamptz IS NULL OR created_at < $4::timestamptz);

-- purge_processed --
-- Delete one bounded batch of Processed rows finished more than $1 days ago ($2 rows at most);
-- SKIP LOCKED and short transactions: it never waits for, or blocks, the relay
WITH doomed AS (
    SELECT outbox_message_id
    FROM outbox_messages
    WHERE status = 'Processed' AND processed_at < now() - make_interval(days => $1)
    ORDER BY processed_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM outbox_messages AS m
USING doomed
WHERE m.outbox_message_id = doomed.outbox_message_id;

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

-- show_message --
-- One message, every column
SELECT * FROM outbox_messages WHERE outbox_message_id = $1;

-- show_attempts --
-- A message's delivery attempts, oldest first
SELECT attempt_number, lease_token, started_at, finished_at, duration_ms, outcome, applied,
       http_status, error_class, error, response_snippet
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
-- Serialise concurrent migrators for the whole session (released by unlock_migrations)
SELECT pg_advisory_lock(hashtext('outbox_migrations'));

-- unlock_migrations --
-- Release the migrators' lock
SELECT pg_advisory_unlock(hashtext('outbox_migrations'));

-- applied_migrations --
-- Migrations already applied, with the checksum they had
SELECT name, checksum FROM outbox_migrations ORDER BY name;

-- record_migration --
-- Remember that a migration file was applied
INSERT INTO outbox_migrations (name, checksum) VALUES ($1, $2);
