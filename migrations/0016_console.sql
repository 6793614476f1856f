-- The operator's console: endpoints paused by hand, and the record of every action taken.

-- An endpoint (of an event type) paused by an operator, shared by every relay: while its row is
-- here, the endpoint's deliveries wait, Pending, and spend no attempt (the lease reads it with
-- the breakers, and the relay defers them as it does behind an open breaker). Resume deletes it.
CREATE TABLE outbox_paused_endpoints (
    event_type text        NOT NULL,
    endpoint   text        NOT NULL,
    paused_at  timestamptz NOT NULL DEFAULT now(),
    paused_by  text        NOT NULL,  -- the identity of the key that paused it, never the key
    PRIMARY KEY (event_type, endpoint)
);

-- Every action taken from the console, its HTTP API or the CLI: what, on which filter, how many
-- rows, when, and by which key (a key's identity: a short hash, never the key). action_id is
-- the client's: the same action sent twice (a repeated click, a retried request) is done once.
CREATE TABLE outbox_console_actions (
    action_id  text        PRIMARY KEY,
    action     text        NOT NULL,
    filter     jsonb       NOT NULL,
    affected   bigint      NOT NULL DEFAULT 0,
    dry_run    boolean     NOT NULL DEFAULT false,
    actor      text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    result     jsonb
);

CREATE INDEX outbox_console_actions_created_idx ON outbox_console_actions (created_at);
