-- outbox: no-transaction
-- Failed rows in the order requeue pages through them, (created_at, outbox_message_id): each batch
-- of `requeue` starts where the last one ended. Over created_at alone, rows sharing one created_at
-- (written in one transaction) were sorted again for every batch: 1M of them did not finish in
-- ten minutes. It also serves what outbox_messages_failed_idx served (purge, status), which 0015
-- drops.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_failed_order_idx
    ON outbox_messages (created_at, outbox_message_id)
    WHERE status = 'Failed';
