-- outbox: no-transaction
-- Due rows without an ordering key, in an index of their own: the lease takes them from here, so
-- rows queued behind a held ordering key (however many, parked or not yet) are never scanned
-- before them. The same due time as outbox_messages_due_idx; built without blocking producers.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_due_unkeyed_idx
    ON outbox_messages (
        (CASE WHEN status = 'Processing'
              THEN COALESCE(lease_expires_at, '-infinity'::timestamptz)
              ELSE next_attempt_at END),
        created_at)
    WHERE status IN ('Pending', 'Processing') AND ordering_key IS NULL;
