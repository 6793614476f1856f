-- Retention and health queries read only the rows they are about.
CREATE INDEX outbox_messages_processed_idx
    ON outbox_messages (processed_at)
    WHERE status = 'Processed';

CREATE INDEX outbox_messages_failed_idx
    ON outbox_messages (created_at)
    WHERE status = 'Failed';
