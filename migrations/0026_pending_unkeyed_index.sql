-- outbox: no-transaction
-- The due rows without an ordering key, Pending ones only: the lease takes them from here beside
-- rows behind held keys (0013's purpose). An in-flight row no longer enters it at its lease (its
-- due time there is when the lease ends, which the due index, outbox_messages_due_idx, serves):
-- one index entry fewer per delivered message, about 86 bytes of WAL (docs/performance.md, "WAL
-- per message"). 0027 drops the index it replaces. Built without blocking producers.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_pending_unkeyed_idx
    ON outbox_messages (next_attempt_at, created_at)
    WHERE status = 'Pending' AND ordering_key IS NULL;
