-- Every statement the relay runs, each under a name that store.py calls it by.
-- Values are always bound parameters.

-- insert_message --
-- Add a Pending row, due now, inside the caller's transaction; returns nothing when the id exists
INSERT INTO outbox_messages (outbox_message_id, event_type, payload, status, next_attempt_at)
VALUES ($1, $2, $3::jsonb, 'Pending', now())
ON CONFLICT (outbox_message_id) DO NOTHING
RETURNING outbox_message_id;

-- lease_batch --
-- Claim due Pending rows and rows whose lease expired; $1 = batch size, $2 = lease seconds,
-- $3 = the largest payload to return: a bigger one (only a row written by hand can be) comes back
-- as NULL with its size, so a batch of them cannot fill the relay's memory.
-- While a row is Processing its next_attempt_at equals lease_expires_at, so the partial index
-- (next_attempt_at, created_at) serves both halves of the seed's condition in one ordered scan.
-- A Processing row without any lease (set by hand) belongs to no worker: it is claimable too.
WITH due AS (
    SELECT outbox_message_id
    FROM outbox_messages
    WHERE status IN ('Pending', 'Processing')
      AND next_attempt_at <= now()
      AND (status = 'Pending' OR lease_expires_at IS NULL OR lease_expires_at <= now())
    ORDER BY next_attempt_at, created_at
    FOR UPDATE SKIP LOCKED
    LIMIT $1
)
UPDATE outbox_messages AS m
SET status = 'Processing',
    attempt_count = m.attempt_count + 1,
    processing_started_at = now(),
    lease_expires_at = now() + make_interval(secs => $2),
    next_attempt_at = now() + make_interval(secs => $2),
    lease_token = gen_random_uuid()
FROM due
WHERE m.outbox_message_id = due.outbox_message_id
RETURNING m.outbox_message_id, m.event_type,
          CASE WHEN octet_length(m.payload::text) <= $3 THEN m.payload::text END AS payload,
          octet_length(m.payload::text) AS payload_bytes,
          m.attempt_count, m.lease_token, m.created_at;

-- record_outcomes --
-- Write a whole batch of outcomes in one statement, fenced by the lease token:
-- a worker whose lease expired and was re-leased cannot overwrite the newer outcome.
-- $1 ids, $2 lease tokens, $3 statuses, $4 retry delays in seconds, $5 errors, $6 "not attempted" flags.
UPDATE outbox_messages AS m
SET status = o.status,
    attempt_count = m.attempt_count - CASE WHEN o.not_attempted THEN 1 ELSE 0 END,
    next_attempt_at = CASE WHEN o.status = 'Pending'
                           THEN now() + make_interval(secs => o.delay_seconds)
                           ELSE m.next_attempt_at END,
    processed_at = CASE WHEN o.status = 'Processed' THEN now() END,
    lease_expires_at = NULL,
    last_error = CASE WHEN o.not_attempted THEN m.last_error ELSE o.last_error END
FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::float8[], $5::text[], $6::bool[])
     AS o(outbox_message_id, lease_token, status, delay_seconds, last_error, not_attempted)
WHERE m.outbox_message_id = o.outbox_message_id
  AND m.status = 'Processing'
  AND m.lease_token = o.lease_token
RETURNING m.outbox_message_id;

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
