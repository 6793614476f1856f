-- Each relay process's learned limit of requests in flight per endpoint, kept so that a new
-- process starts from it rather than from 16 (outbox/relay/learned.py says how; docs/internals.md,
-- "Endpoints"). One row per endpoint and relay process, written by that process at most every
-- few seconds; a process starting reads the others' and writes what it starts from (learned
-- false) under a transaction-level advisory lock, so that processes started at once share what
-- an endpoint that pushed back accepts instead of each taking all of it. A new table: nothing
-- that runs now reads or locks it.
CREATE TABLE outbox_endpoint_limits (
    event_type     text             NOT NULL,
    endpoint       text             NOT NULL,
    relay          uuid             NOT NULL,  -- the process, a random id of its own
    concurrency    double precision NOT NULL,  -- its limit (not learned: what it started from)
    settled        double precision,           -- what its last push-back left of the limit
    pushed_back_at timestamptz,                -- when that push-back came (429, 503, timeout …)
    learned        boolean          NOT NULL DEFAULT false,  -- from answers, not only a start
    updated_at     timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (event_type, endpoint, relay)
);
