-- One row per delivery attempt, written in the same statement as the attempt's outcome.
CREATE TABLE outbox_attempts (
    attempt_id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    outbox_message_id uuid        NOT NULL
        REFERENCES outbox_messages (outbox_message_id) ON DELETE CASCADE,
    attempt_number    integer     NOT NULL,
    lease_token       uuid        NOT NULL,
    started_at        timestamptz NOT NULL,  -- the worker's clock: for reading, not for leasing
    finished_at       timestamptz NOT NULL,
    duration_ms       integer     NOT NULL,
    outcome           text        NOT NULL
        CONSTRAINT outbox_attempts_outcome_check
        CHECK (outcome IN ('Processed', 'Pending', 'Failed')),
    applied           boolean     NOT NULL,  -- false: the lease had passed to another worker
    http_status       integer,
    error_class       text,
    error             text,
    response_snippet  text,
    recorded_at       timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX outbox_attempts_message_idx ON outbox_attempts (outbox_message_id, attempt_id);
