-- outbox: no-transaction
-- Replaced by outbox_messages_failed_order_idx (0014), which has created_at first too.
DROP INDEX CONCURRENTLY IF EXISTS outbox_messages_failed_idx;
