-- The partitioned layout's statements (outbox/store/partitions), each under the name its module
-- runs it by. DDL binds no parameter: a {table}, {name} or {key} is an identifier and a {bound},
-- {lower} or {upper} a time, each filled in by store.sql.fill once checked. Values of the other
-- statements are bound parameters.

-- is_partitioned --
-- Whether outbox_messages is the partitioned table
SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass('outbox_messages');

-- partitioning_missing --
-- Whether the layout's settings table is missing (never converted)
SELECT to_regclass('outbox_partitioning') IS NULL;

-- partition_interval --
-- The layout's partition interval ('daily' or 'hourly')
SELECT partition_interval FROM outbox_partitioning;

-- partitions_of --
-- The partitions of table $1 with their bounds, oldest first, the default partition last
SELECT c.relname AS name,
       (regexp_match(b.bound, 'FROM \(''([^'']+)''\)'))[1]::timestamptz AS lower,
       (regexp_match(b.bound, 'TO \(''([^'']+)''\)'))[1]::timestamptz AS upper,
       b.bound = 'DEFAULT' AS is_default
FROM pg_inherits AS i
JOIN pg_class AS c ON c.oid = i.inhrelid
CROSS JOIN LATERAL (SELECT pg_get_expr(c.relpartbound, c.oid) AS bound) AS b
WHERE i.inhparent = to_regclass($1)
ORDER BY b.bound = 'DEFAULT', 3 NULLS LAST;

-- live_rows_of --
-- The messages of partition {name} still under way or Failed (status's oldest partition)
SELECT count(*) FROM {name} WHERE status IN ('Pending', 'Processing', 'Failed');

-- default_rows --
-- The rows of default partition {name}, and those created from $1 on (the oldest partition's
-- start: a partition made ahead would have taken them)
SELECT count(*) AS rows, count(*) FILTER (WHERE created_at >= $1) AS unrouted FROM {name};

-- index_definitions --
-- Every index of table $1 but its primary key and the conversion's own keys
SELECT pg_get_indexdef(i.indexrelid) AS definition
FROM pg_index AS i
JOIN pg_class AS c ON c.oid = i.indexrelid
WHERE i.indrelid = to_regclass($1) AND NOT i.indisprimary
  AND c.relname NOT LIKE '%\_legacy\_key'
ORDER BY c.relname;

-- index_names --
-- The names of every index of table $1
SELECT c.relname FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
WHERE i.indrelid = to_regclass($1) ORDER BY c.relname;

-- relation_exists --
-- Whether a table or index named $1 exists
SELECT to_regclass($1) IS NOT NULL;

-- is_partition --
-- Whether table $1 is attached as a partition
SELECT relispartition FROM pg_class WHERE oid = to_regclass($1);

-- has_rows --
-- Whether table {table} holds any row
SELECT EXISTS (SELECT 1 FROM {table});

-- set_local_lock_timeout --
-- How long the statements of this transaction wait for a lock ($1, e.g. '2000ms'): SET LOCAL
SELECT set_config('lock_timeout', $1, true);

-- lock_tables --
-- The switch's lock: no producer or relay uses either table until the transaction ends
LOCK TABLE outbox_messages, outbox_attempts IN ACCESS EXCLUSIVE MODE;

-- drop_next_tables --
-- The new tables of a conversion that stopped half-way, made again from the start
DROP TABLE IF EXISTS outbox_messages_next, outbox_attempts_next;

-- create_partitioning --
-- The layout's settings: its interval, the bound of the legacy partition, whether the legacy
-- ids are claimed
CREATE TABLE IF NOT EXISTS outbox_partitioning (
    only_row           boolean     PRIMARY KEY DEFAULT true CHECK (only_row),
    partition_interval text        NOT NULL
        CHECK (partition_interval IN ('daily', 'hourly')),
    legacy_bound       timestamptz,
    ids_copied         boolean     NOT NULL DEFAULT false
);

-- clear_partitioning --
DELETE FROM outbox_partitioning;

-- set_partitioning --
-- The interval of the conversion under way ($1)
INSERT INTO outbox_partitioning (partition_interval) VALUES ($1);

-- create_message_ids --
-- Caller-given ids, one row each, so that a second message with one is refused on every layout
CREATE TABLE IF NOT EXISTS outbox_message_ids (
    outbox_message_id uuid        PRIMARY KEY,
    created_at        timestamptz NOT NULL DEFAULT now()
);

-- create_message_ids_index --
CREATE INDEX IF NOT EXISTS outbox_message_ids_created_idx
ON outbox_message_ids USING brin (created_at);

-- create_attempts_sequence --
-- The attempts' ids on the partitioned table (a partitioned table's identity is its parent's)
CREATE SEQUENCE IF NOT EXISTS outbox_attempts_id_seq AS bigint;

-- create_processed_index --
-- Processed rows by finish time: the plain table's index until migration 0020, kept on the
-- partitioned layout, where the drop of a partition reads it for live rows
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_processed_idx
ON outbox_messages (processed_at) WHERE status = 'Processed';

-- create_partitioned_next --
-- The new parent of {table}, partitioned by {key}, with its columns, defaults and checks
CREATE TABLE {table}_next (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS
    INCLUDING COMMENTS) PARTITION BY RANGE ({key});

-- create_plain_next --
-- The plain table that takes {table}'s place again (its storage parameters follow)
CREATE TABLE {table}_next (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS
    INCLUDING COMMENTS);

-- add_next_key --
-- The primary key of the new {table}: {columns}
ALTER TABLE {table}_next ADD CONSTRAINT {table}_pkey_next PRIMARY KEY ({columns});

-- create_default_partition --
-- The new parent's default partition: a safety net for a row no partition covers (its storage
-- parameters follow)
CREATE TABLE {table}_default PARTITION OF {table}_next DEFAULT;

-- number_next_attempts --
ALTER TABLE outbox_attempts_next ALTER COLUMN attempt_id
SET DEFAULT nextval('outbox_attempts_id_seq');

-- own_attempt_ids_next --
ALTER SEQUENCE outbox_attempts_id_seq OWNED BY outbox_attempts_next.attempt_id;

-- disown_attempt_ids --
ALTER SEQUENCE outbox_attempts_id_seq OWNED BY NONE;

-- own_attempt_ids --
ALTER SEQUENCE outbox_attempts_id_seq OWNED BY outbox_attempts.attempt_id;

-- create_delete_trigger --
-- A deleted message's history goes with it (migration 0012's trigger, on table {table})
CREATE TRIGGER outbox_messages_delete_attempts AFTER DELETE ON {table}
REFERENCING OLD TABLE AS deleted_messages
FOR EACH STATEMENT EXECUTE FUNCTION outbox_delete_attempts();

-- create_truncate_trigger --
CREATE TRIGGER outbox_messages_truncate_attempts AFTER TRUNCATE ON {table}
FOR EACH STATEMENT EXECUTE FUNCTION outbox_truncate_attempts();

-- drop_trigger --
-- A trigger {name} of outbox_messages, left behind with the table that steps aside
DROP TRIGGER IF EXISTS {name} ON outbox_messages;

-- create_messages_legacy_key --
-- The plain messages table's key with the partition key in it, built without blocking
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_legacy_key
ON outbox_messages (outbox_message_id, created_at);

-- create_attempts_legacy_key --
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS outbox_attempts_legacy_key
ON outbox_attempts (outbox_message_id, attempt_id, recorded_at);

-- validate_ordering_check --
-- Migration 0002's check, validated: a partition's checks must be
ALTER TABLE outbox_messages VALIDATE CONSTRAINT outbox_messages_ordering_check;

-- clock --
SELECT clock_timestamp();

-- now --
SELECT now();

-- continue_attempt_ids --
-- Attempt ids go on rising: from the identity's sequence (migration 0003), or from this one's
-- own value (a table converted back, then again)
SELECT setval('outbox_attempts_id_seq', GREATEST(
    (SELECT last_value FROM outbox_attempts_id_seq),
    COALESCE(pg_sequence_last_value(
        pg_get_serial_sequence('outbox_attempts', 'attempt_id')::regclass), 0)) + 1, false);

-- legacy_primary_key --
-- The plain table's key becomes the one with its partition key
ALTER TABLE {table} DROP CONSTRAINT {table}_pkey,
ADD CONSTRAINT {table}_legacy_pkey PRIMARY KEY USING INDEX {table}_legacy_key;

-- rename_index --
ALTER INDEX {name} RENAME TO {new_name};

-- rename_table --
ALTER TABLE {name} RENAME TO {new_name};

-- drop_table --
DROP TABLE {table};

-- drop_attempts_identity --
ALTER TABLE outbox_attempts ALTER attempt_id DROP IDENTITY IF EXISTS;

-- create_partition --
-- Partition {name} of {table}, from {lower} to {upper} (its storage parameters follow)
CREATE TABLE {name} PARTITION OF {table} FOR VALUES FROM ({lower}) TO ({upper});

-- unsummarise_first_ranges --
-- The BRIN indexes of partition $1, made empty: no summary of their first range, which each row
-- appended there would widen in the WAL, until that range is full (as migrations 0024 and 0025
-- do for the plain table and for the partitions made later); the ranges unsummarised
SELECT count(brin_desummarize_range(i.indexrelid, 0))
FROM pg_index AS i
JOIN pg_class AS c ON c.oid = i.indexrelid
JOIN pg_am AS a ON a.oid = c.relam
WHERE i.indrelid = to_regclass($1)
  AND a.amname = 'brin';

-- set_legacy_bound --
UPDATE outbox_partitioning SET legacy_bound = $1;

-- legacy_bound --
SELECT legacy_bound FROM outbox_partitioning;

-- default_has_rows_before --
-- Whether {table}'s default partition holds a row of before the conversion ($1), by {key}
SELECT EXISTS (SELECT 1 FROM {table}_default WHERE {key} < $1);

-- bound_legacy --
-- The legacy table's bound, as a check validated apart without blocking: the attach then skips
-- its own scan, which would hold the default partition's lock meanwhile
ALTER TABLE {table}_legacy DROP CONSTRAINT IF EXISTS {table}_legacy_bound,
ADD CONSTRAINT {table}_legacy_bound CHECK ({key} < {bound}) NOT VALID;

-- validate_legacy_bound --
ALTER TABLE {table}_legacy VALIDATE CONSTRAINT {table}_legacy_bound;

-- move_default_to_legacy --
-- Rows of a transaction that began before the switch and wrote after it went to the default
-- partition: they belong to the legacy one
WITH moved AS (DELETE FROM {table}_default WHERE {key} < {bound} RETURNING *)
INSERT INTO {table}_legacy SELECT * FROM moved;

-- attach_legacy --
ALTER TABLE {table} ATTACH PARTITION {table}_legacy FOR VALUES FROM (MINVALUE) TO ({bound});

-- ids_copied --
SELECT ids_copied FROM outbox_partitioning;

-- set_ids_copied --
UPDATE outbox_partitioning SET ids_copied = true;

-- copy_legacy_ids --
-- One batch of ids from before the conversion ($2 of them, after id $1) claimed in
-- outbox_message_ids; returns the last id of the batch (NULL: none left)
WITH batch AS (
    SELECT outbox_message_id, created_at
    FROM outbox_messages_legacy
    WHERE $1::uuid IS NULL OR outbox_message_id > $1::uuid
    ORDER BY outbox_message_id
    LIMIT $2
), claimed AS (
    INSERT INTO outbox_message_ids (outbox_message_id, created_at)
    SELECT outbox_message_id, created_at FROM batch
    ON CONFLICT (outbox_message_id) DO NOTHING
)
SELECT max(outbox_message_id::text)::uuid FROM batch;

-- make_partition --
-- Partition $2 of table $1 for [$3, $4), as the tables' owner (migration 0021); false when a
-- racing purge had made it
SELECT outbox_make_partition($1::regclass, $2, $3, $4);

-- live_rows --
-- The live rows of partition {name} past the retention ($1; Failed ones: $2), at most $3
-- (migration 0021 holds the rule)
SELECT count(*) FROM (SELECT 1 FROM {name}
                      WHERE outbox_message_is_live(status, processed_at, created_at,
                                                   $1, $2::timestamptz)
                      LIMIT $3) AS live;

-- drop_partition --
-- Detach and drop partition $2 of table $1 as the tables' owner (migration 0021), carrying over
-- its live messages (past $3; Failed ones past $4) or the history of messages $5: how many rows
-- it carried, or NULL when a racing purge had dropped it
SELECT outbox_drop_partition($1::regclass, $2, $3, $4, $5);

-- purge_default --
-- One batch ($3) of the default partition's rows past retention (Processed before $1, Failed
-- created before $2), deleted with their history
WITH doomed AS (
    SELECT outbox_message_id FROM outbox_messages_default
    WHERE (status = 'Processed' AND processed_at < $1)
       OR (status = 'Failed' AND created_at < $2::timestamptz)
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
DELETE FROM outbox_messages AS m
USING doomed
WHERE m.outbox_message_id = doomed.outbox_message_id;

-- kept_message_ids --
-- The messages created before $1 that are still kept, at most $2: their history stays when an
-- attempts partition is dropped
SELECT array_agg(outbox_message_id) FROM (
    SELECT outbox_message_id FROM outbox_messages WHERE created_at < $1 LIMIT $2) AS kept;

-- release_ids --
-- One batch ($2) of caller-given ids whose message is gone, claimed before $1 (the oldest
-- partition's start: the probe reads only below it, the default partition)
DELETE FROM outbox_message_ids
WHERE outbox_message_id IN (
    SELECT i.outbox_message_id FROM outbox_message_ids AS i
    WHERE i.created_at < $1
      AND NOT EXISTS (SELECT 1 FROM outbox_messages AS m
                      WHERE m.outbox_message_id = i.outbox_message_id
                        AND m.created_at = i.created_at
                        AND m.created_at < $1)
    LIMIT $2);

-- move_live_messages_back --
-- One batch ($2, after id $1) of the live messages of the partitioned table set aside, moved to
-- the plain table (delivery resumes first); the batch's last id and size
WITH batch AS (
    SELECT outbox_message_id FROM outbox_messages_partitioned_old
    WHERE (status <> 'Processed') AND ($1::uuid IS NULL OR outbox_message_id > $1::uuid)
    ORDER BY outbox_message_id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), moved AS (
    DELETE FROM outbox_messages_partitioned_old AS o USING batch AS b
    WHERE (o.outbox_message_id) = (b.outbox_message_id)
    RETURNING o.*
), inserted AS (
    INSERT INTO outbox_messages SELECT * FROM moved RETURNING outbox_message_id
)
SELECT count(*) AS moved,
       (SELECT max(outbox_message_id::text)::uuid FROM batch) AS last,
       (SELECT count(*) FROM batch) AS taken
FROM inserted;

-- move_messages_back --
-- move_live_messages_back for every message
WITH batch AS (
    SELECT outbox_message_id FROM outbox_messages_partitioned_old
    WHERE (true) AND ($1::uuid IS NULL OR outbox_message_id > $1::uuid)
    ORDER BY outbox_message_id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), moved AS (
    DELETE FROM outbox_messages_partitioned_old AS o USING batch AS b
    WHERE (o.outbox_message_id) = (b.outbox_message_id)
    RETURNING o.*
), inserted AS (
    INSERT INTO outbox_messages SELECT * FROM moved RETURNING outbox_message_id
)
SELECT count(*) AS moved,
       (SELECT max(outbox_message_id::text)::uuid FROM batch) AS last,
       (SELECT count(*) FROM batch) AS taken
FROM inserted;

-- move_attempts_back --
-- move_messages_back for the attempt history, by (message, attempt)
WITH batch AS (
    SELECT outbox_message_id, attempt_id FROM outbox_attempts_partitioned_old
    WHERE (true) AND ($1::uuid IS NULL OR outbox_message_id > $1::uuid)
    ORDER BY outbox_message_id, attempt_id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), moved AS (
    DELETE FROM outbox_attempts_partitioned_old AS o USING batch AS b
    WHERE (o.outbox_message_id, o.attempt_id) = (b.outbox_message_id, b.attempt_id)
    RETURNING o.*
), inserted AS (
    INSERT INTO outbox_attempts SELECT * FROM moved RETURNING outbox_message_id
)
SELECT count(*) AS moved,
       (SELECT max(outbox_message_id::text)::uuid FROM batch) AS last,
       (SELECT count(*) FROM batch) AS taken
FROM inserted;

-- drop_partitioned_leftovers --
-- What the partitioned layout leaves once its rows are back in the plain tables
DROP TABLE outbox_messages_partitioned_old, outbox_attempts_partitioned_old,
    outbox_message_ids, outbox_partitioning;
