-- Messages held back behind their ordering key. A keyed message whose predecessor is not being
-- delivered (Pending, or Failed under OUTBOX_ORDERING_ON_FAILURE=hold) cannot be sent before it,
-- so the lease parks it: next_attempt_at = 'infinity', past the end of every due scan. The
-- message that lets it go (delivered, or Failed where that does not hold the key) makes it due
-- again in the statement that records its outcome; a sweep repairs what was changed by hand.
-- Without this, every lease walked each row queued behind a held key.
COMMENT ON COLUMN outbox_messages.next_attempt_at IS
    'When the row is next due. While Processing it equals lease_expires_at, so one index serves both due Pending rows and expired leases. ''infinity'': parked behind an earlier message of its ordering key.';

-- Only parked rows enter it: the sweep finds the keys that hold messages back without reading
-- the messages themselves.
CREATE INDEX outbox_messages_held_idx
    ON outbox_messages (ordering_key, ordering_seq)
    WHERE next_attempt_at = 'infinity';
