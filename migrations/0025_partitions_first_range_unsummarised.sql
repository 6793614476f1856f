-- The partitioned layout's partitions, made ahead of time and empty, each began with its BRIN
-- index (the attempts' finish time, 0018) summarising its first range of 128 pages, which every
-- attempt appended there widened (about 60-70 bytes of WAL each): every attempt of a partition
-- that holds fewer than about 6,400, as most hourly ones do. outbox_make_partition (0021) now
-- takes that summary away as it attaches a partition still inside its first range; autovacuum
-- summarises the range once it is full (autosummarize). The same function otherwise; its
-- privileges are kept.
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
    -- Its BRIN indexes, built as it was attached, summarise its first range (empty, or the few
    -- rows moved in); none while it is still inside that range (as 0024 on the plain layout).
    PERFORM brin_desummarize_range(i.indexrelid, 0)
    FROM pg_index AS i
    JOIN pg_class AS c ON c.oid = i.indexrelid
    JOIN pg_am AS a ON a.oid = c.relam
    WHERE i.indrelid = format('%I.%I', v_schema, p_partition)::regclass
      AND a.amname = 'brin'
      AND pg_relation_size(i.indrelid) < 128 * current_setting('block_size')::bigint;
    RETURN true;
END
$$;
