-- The consumer's inbox: one row per webhook id it has processed, written in the same transaction
-- as the business change the webhook caused. The table name and columns are a public contract.
CREATE TABLE outbox_inbox (
    webhook_id  text        PRIMARY KEY,
    received_at timestamptz NOT NULL DEFAULT now()
);

-- purge --inbox deletes the oldest rows first.
CREATE INDEX outbox_inbox_received_at_idx ON outbox_inbox (received_at);
