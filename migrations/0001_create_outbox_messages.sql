-- The outbox table. Column names and status strings are a public contract:
-- producers insert rows here and operators query them.
CREATE TABLE outbox_messages (
    outbox_message_id     uuid        PRIMARY KEY,
    event_type            text        NOT NULL,
    payload               jsonb       NOT NULL,
    status                text        NOT NULL DEFAULT 'Pending'
        CONSTRAINT outbox_messages_status_check
        CHECK (status IN ('Pending', 'Processing', 'Processed', 'Failed')),
    attempt_count         integer     NOT NULL DEFAULT 0
        CONSTRAINT outbox_messages_attempt_count_check CHECK (attempt_count >= 0),
    next_attempt_at       timestamptz NOT NULL DEFAULT now(),
    processing_started_at timestamptz,
    lease_expires_at      timestamptz,
    processed_at          timestamptz,
    last_error            text,
    created_at            timestamptz NOT NULL DEFAULT now(),
    -- Fencing token: a fresh value per lease. An outcome is written only while the
    -- row still carries the token of the lease that produced it.
    lease_token           uuid
);

COMMENT ON COLUMN outbox_messages.next_attempt_at IS
    'When the row is next due. While Processing it equals lease_expires_at, so one index serves both due Pending rows and expired leases.';

-- Leasing reads only live rows: Processed and Failed rows never enter this index,
-- so the lease stays proportional to the batch however many of them accumulate.
CREATE INDEX outbox_messages_due_idx
    ON outbox_messages (next_attempt_at, created_at)
    WHERE status IN ('Pending', 'Processing');
