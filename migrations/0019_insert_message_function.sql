-- The insert of a message whose id the caller gave (enqueue's message_id=): one row with the id,
-- or none when a message with that id exists. A function, so that producers run one statement on
-- both layouts of the table: on the partitioned one (`migrate --partitioned`), whose primary key
-- must hold the partition key, an id's uniqueness is kept by outbox_message_ids, and the
-- conversion replaces this function by one that claims the id there first (outbox/store/partitions.py).
-- PL/pgSQL: its plan is kept for the session, as a prepared INSERT's is.
CREATE FUNCTION outbox_insert_message(
    p_id uuid, p_event_type text, p_payload jsonb, p_ordering_key text, p_trace_context jsonb)
RETURNS SETOF uuid
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
    INSERT INTO outbox_messages AS m
        (outbox_message_id, event_type, payload, status, next_attempt_at, ordering_key,
         ordering_seq, trace_context)
    VALUES (p_id, p_event_type, p_payload, 'Pending', now(), p_ordering_key,
            CASE WHEN p_ordering_key IS NOT NULL THEN nextval('outbox_messages_ordering_seq') END,
            p_trace_context)
    ON CONFLICT (outbox_message_id) DO NOTHING
    RETURNING m.outbox_message_id;
END
$$;
