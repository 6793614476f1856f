-- The triggers of 0011 delete a deleted message's history as the foreign key's cascade did: as
-- the tables' owner (a role allowed to delete messages need not be allowed to delete attempts)
-- and in the deleted messages' own schema, whatever the deleting session's search_path.
CREATE OR REPLACE FUNCTION outbox_delete_attempts() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    EXECUTE format(
        'DELETE FROM %I.outbox_attempts AS a USING deleted_messages AS d '
        'WHERE a.outbox_message_id = d.outbox_message_id',
        TG_TABLE_SCHEMA);
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION outbox_truncate_attempts() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    EXECUTE format('TRUNCATE %I.outbox_attempts', TG_TABLE_SCHEMA);
    RETURN NULL;
END
$$;

REVOKE ALL ON FUNCTION outbox_delete_attempts() FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox_truncate_attempts() FROM PUBLIC;
