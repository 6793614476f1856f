-- outbox: no-transaction
-- Processed rows in the order the console lists messages, (created_at, outbox_message_id), read
-- backwards: with outbox_messages_failed_order_idx (Failed) and the due index (the backlog), every
-- row has an index to be listed newest first from, and a filter no index serves reads a bounded
-- number of them (console_scanned). Partial: a message enters it once, at its outcome, where an
-- index over every row takes an entry at its insert and at each of its updates too; WAL per
-- message of both in docs/performance.md ("The console at scale"). Built without blocking.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_processed_order_idx
    ON outbox_messages (created_at, outbox_message_id)
    WHERE status = 'Processed';
