-- A Processing row is due when its lease ends, by lease_expires_at itself: an operator who
-- expires a stuck lease by hand (UPDATE … SET lease_expires_at = now()) sees it taken at once.
-- The lease's one ordered scan stays on one partial index, now over the row's due time: for a
-- Pending row next_attempt_at, for a Processing row lease_expires_at (a Processing row with no
-- lease at all, set by hand, belongs to no worker: due at once).
CREATE INDEX outbox_messages_due_at_idx
    ON outbox_messages (
        (CASE WHEN status = 'Processing'
              THEN COALESCE(lease_expires_at, '-infinity'::timestamptz)
              ELSE next_attempt_at END),
        created_at)
    WHERE status IN ('Pending', 'Processing');

DROP INDEX outbox_messages_due_idx;
ALTER INDEX outbox_messages_due_at_idx RENAME TO outbox_messages_due_idx;

COMMENT ON COLUMN outbox_messages.next_attempt_at IS
    'When a Pending row is next due (''infinity'': parked behind an earlier message of its ordering key). While Processing the row is due when lease_expires_at passes; next_attempt_at then shows the same time.';
