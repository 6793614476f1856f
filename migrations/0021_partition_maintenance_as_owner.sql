-- The partitioned layout's maintenance (the purge makes partitions ahead and drops those past
-- retention) as the tables' owner. Making, attaching, detaching and dropping a partition needs
-- ownership; the relay's own role (`python -m outbox grant`) has only EXECUTE on these two.
-- SECURITY DEFINER, their search_path the migrating session's (where these functions and the
-- tables are), every table named with the parent's schema (an oid the caller resolved), and
-- every partition name checked against the layout's own before it reaches a statement. Purges
-- may race (every replica runs one): each takes one advisory lock for its transaction, and a
-- partition another purge made or dropped meanwhile is left as it is.

-- Whether a message is still live at a purge: what a partition's drop carries over.
CREATE OR REPLACE FUNCTION outbox_message_is_live(
    p_status text, p_processed_at timestamptz, p_created_at timestamptz,
    p_cutoff timestamptz, p_failed_cutoff timestamptz)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_status IN ('Pending', 'Processing')
        OR (p_status = 'Processed' AND p_processed_at >= p_cutoff)
        OR (p_status = 'Failed' AND (p_failed_cutoff IS NULL OR p_created_at >= p_failed_cutoff))
$$;

-- The parent's schema, after checking that it is one of the outbox's two partitioned tables and
-- that p_partition is a name the layout gives its partitions.
CREATE OR REPLACE FUNCTION outbox_partition_schema(p_parent regclass, p_partition text)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_schema text;
    v_table text;
BEGIN
    SELECT n.nspname, c.relname INTO v_schema, v_table
    FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
    WHERE c.oid = p_parent AND c.relkind = 'p';
    IF v_table IS NULL OR v_table NOT IN ('outbox_messages', 'outbox_attempts') THEN
        RAISE EXCEPTION 'not a partitioned outbox table: %', p_parent USING ERRCODE = '22023';
    END IF;
    IF p_partition !~ ('^' || v_table || '_(legacy|p[0-9]{8}(_[0-9]{2})?(_[0-9]{6})?)$') THEN
        RAISE EXCEPTION 'not a partition name of %: %', v_table, p_partition USING ERRCODE = '22023';
    END IF;
    RETURN v_schema;
END
$$;

-- Make the partition [p_lower, p_upper) of p_parent: the rows its default partition holds in that
-- range move into it, then it is attached. False when it exists already.
CREATE OR REPLACE FUNCTION outbox_make_partition(
    p_parent regclass, p_partition text, p_lower timestamptz, p_upper timestamptz)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    v_schema text := outbox_partition_schema(p_parent, p_partition);
    v_table text := (SELECT relname FROM pg_class WHERE oid = p_parent);
    v_key text := CASE v_table WHEN 'outbox_messages' THEN 'created_at' ELSE 'recorded_at' END;
BEGIN
    IF p_partition LIKE '%\_legacy' THEN
        RAISE EXCEPTION 'the legacy partition is made by the conversion only' USING ERRCODE = '22023';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('outbox_partitions'));
    IF to_regclass(format('%I.%I', v_schema, p_partition)) IS NOT NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TABLE %I.%I (LIKE %I.%I INCLUDING DEFAULTS INCLUDING CONSTRAINTS)%s',
                   v_schema, p_partition, v_schema, v_table,
                   CASE v_table WHEN 'outbox_messages' THEN ' WITH (fillfactor = 50)' ELSE '' END);
    EXECUTE format('WITH moved AS (DELETE FROM %I.%I WHERE %I >= $1 AND %I < $2 RETURNING *) '
                   'INSERT INTO %I.%I SELECT * FROM moved',
                   v_schema, v_table || '_default', v_key, v_key, v_schema, p_partition)
        USING p_lower, p_upper;
    EXECUTE format('ALTER TABLE %I.%I ATTACH PARTITION %I.%I FOR VALUES FROM (%L) TO (%L)',
                   v_schema, v_table, v_schema, p_partition, p_lower, p_upper);
    RETURN true;
END
$$;

-- Detach and drop the partition p_partition of p_parent, carrying into the parent (its default
-- partition) the messages still live at the cutoffs, or the attempts of the messages p_kept_ids
-- names. Returns how many rows were carried; NULL when it is no longer attached (another purge
-- dropped it).
CREATE OR REPLACE FUNCTION outbox_drop_partition(
    p_parent regclass, p_partition text, p_cutoff timestamptz, p_failed_cutoff timestamptz,
    p_kept_ids uuid[])
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    v_schema text := outbox_partition_schema(p_parent, p_partition);
    v_table text := (SELECT relname FROM pg_class WHERE oid = p_parent);
    v_carried bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('outbox_partitions'));
    IF NOT EXISTS (SELECT 1 FROM pg_inherits
                   WHERE inhparent = p_parent
                     AND inhrelid = to_regclass(format('%I.%I', v_schema, p_partition))) THEN
        RETURN NULL;
    END IF;
    EXECUTE format('ALTER TABLE %I.%I DETACH PARTITION %I.%I',
                   v_schema, v_table, v_schema, p_partition);
    IF v_table = 'outbox_messages' THEN
        EXECUTE format('INSERT INTO %1$I.outbox_messages SELECT * FROM %1$I.%2$I '
                       'WHERE %1$I.outbox_message_is_live(status, processed_at, created_at, $1, $2)',
                       v_schema, p_partition)
            USING p_cutoff, p_failed_cutoff;
    ELSE
        EXECUTE format('INSERT INTO %1$I.outbox_attempts SELECT * FROM %1$I.%2$I '
                       'WHERE outbox_message_id = ANY ($1)', v_schema, p_partition)
            USING coalesce(p_kept_ids, '{}');
    END IF;
    GET DIAGNOSTICS v_carried = ROW_COUNT;
    EXECUTE format('DROP TABLE %I.%I', v_schema, p_partition);
    RETURN v_carried;
END
$$;

REVOKE ALL ON FUNCTION outbox_make_partition(regclass, text, timestamptz, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox_drop_partition(regclass, text, timestamptz, timestamptz, uuid[])
    FROM PUBLIC;
