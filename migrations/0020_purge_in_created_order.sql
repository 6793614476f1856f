-- The purge reads Processed rows in created order (outbox_messages_processed_order_idx, 0017), so
-- the index on processed_at alone (0004) goes: one index entry less at every outcome write
-- (docs/performance.md#wal-per-message). On the partitioned layout (migrate --partitioned) it is
-- a partitioned index, which PostgreSQL drops only inside a transaction: here, under the lock
-- rules of every migration. On the plain table nothing happens here; 0021 drops it CONCURRENTLY.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_class
               WHERE relname = 'outbox_messages_processed_idx' AND relkind = 'I') THEN
        DROP INDEX outbox_messages_processed_idx;
    END IF;
END
$$;
