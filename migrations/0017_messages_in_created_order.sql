-- outbox: no-transaction
-- Every row in the order the console lists them, (created_at, outbox_message_id), newest first
-- read backwards: the first page of the unfiltered list, of a time range, and the bounded scan
-- behind every filter no other index serves. Its WAL cost per delivered message is measured in
-- docs/performance.md ("The console at scale"); built without blocking producers.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_created_idx
    ON outbox_messages (created_at, outbox_message_id);
