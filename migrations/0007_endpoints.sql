-- Several endpoints per event type, each with a delivery state of its own, and a circuit breaker
-- per endpoint shared by every relay.

-- Where a message's endpoints stand, when they differ (one delivered, another retrying or
-- failed): {"<endpoint>": {"status": "Pending" | "Processed" | "Failed", "attempts": n,
-- "error": "…"}}. NULL when they do not: every endpoint is where the row's own status,
-- attempt_count and last_error say (always so for a message with one endpoint, until it fails).
ALTER TABLE outbox_messages ADD COLUMN endpoint_state jsonb;

-- Which endpoint an attempt went to (NULL: before endpoints were named, or no endpoint at all).
ALTER TABLE outbox_attempts ADD COLUMN endpoint text;

-- One row per endpoint that has failed lately. consecutive_failures counts retryable failures
-- (connection errors, timeouts, 408, 429, 5xx) since its last success. While reopen_at is in the
-- future the endpoint is open: its messages wait, spending no attempt. Once it has passed, one
-- relay claims the probe (probe_until) and one request decides: success closes the breaker,
-- failure opens it again for longer (opens counts the cool-downs in a row).
CREATE TABLE outbox_endpoints (
    event_type           text        NOT NULL,
    endpoint             text        NOT NULL,
    consecutive_failures integer     NOT NULL DEFAULT 0,
    opens                integer     NOT NULL DEFAULT 0,
    opened_at            timestamptz,
    reopen_at            timestamptz,
    probe_until          timestamptz,
    updated_at           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (event_type, endpoint)
);
