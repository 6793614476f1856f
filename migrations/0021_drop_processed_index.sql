-- outbox: no-transaction
-- The index on processed_at alone (0004) on the plain table, dropped without blocking writes; the
-- purge reads outbox_messages_processed_order_idx instead (0020 says why, and drops it on the
-- partitioned layout).
DROP INDEX CONCURRENTLY IF EXISTS outbox_messages_processed_idx;
