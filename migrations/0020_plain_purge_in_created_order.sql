-- The plain table's purge reads Processed rows in created order (outbox_messages_processed_order_idx,
-- 0017), going on from the last row it deleted, so its index on processed_at alone (0004) goes:
-- one index entry less at every outcome write (docs/performance.md#wal-per-message). The
-- partitioned layout keeps it: the drop of a partition looks for live rows by processed_at while
-- it holds the partition's lock (outbox.store.partitions), so there it is a partitioned index
-- (relkind 'I') and stays. The drop takes the table's lock for an instant, under the lock rules
-- of every migration.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_class
               WHERE relname = 'outbox_messages_processed_idx' AND relkind = 'i'
                 AND pg_table_is_visible(oid)) THEN
        DROP INDEX outbox_messages_processed_idx;
    END IF;
END
$$;
