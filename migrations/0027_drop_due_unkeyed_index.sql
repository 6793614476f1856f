-- outbox: no-transaction
-- Replaced by outbox_messages_pending_unkeyed_idx (0026). A relay older than 0026 still leases
-- correctly: beside rows behind held keys it reads the unkeyed ones from the due index instead,
-- slower only there, until it is replaced.
DROP INDEX CONCURRENTLY IF EXISTS outbox_messages_due_unkeyed_idx;
