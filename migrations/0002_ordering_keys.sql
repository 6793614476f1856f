-- Per-aggregate ordering (opt-in per message). A message with an ordering key is leased only
-- when no earlier message with the same key is still waiting (Pending or Processing, and Failed
-- too when OUTBOX_ORDERING_ON_FAILURE=hold). "Earlier" is enqueue order, from a sequence.
ALTER TABLE outbox_messages
    ADD COLUMN ordering_key text,
    ADD COLUMN ordering_seq bigint;

CREATE SEQUENCE outbox_messages_ordering_seq AS bigint;

-- Both or neither. NOT VALID: existing rows have neither, and skipping the scan keeps the lock short.
ALTER TABLE outbox_messages
    ADD CONSTRAINT outbox_messages_ordering_check
    CHECK ((ordering_key IS NULL) = (ordering_seq IS NULL)) NOT VALID;

-- The lease's "is an earlier message with my key still waiting?" probe. Processed rows never
-- block anything, so they stay out of the index.
CREATE INDEX outbox_messages_ordering_idx
    ON outbox_messages (ordering_key, ordering_seq)
    WHERE ordering_key IS NOT NULL AND status <> 'Processed';
