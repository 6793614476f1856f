-- The attempt history without its foreign key to outbox_messages. Checking it cost every
-- recorded attempt a query of its own and a row lock (a quarter of the outcome write's database
-- CPU, and a WAL record per attempt). What it guaranteed is kept another way:
-- * an attempt is written only with its message: the outcome write records an attempt for a
--   message it updates in the same statement, or for one it locks FOR KEY SHARE first, as the
--   check did (a stale attempt: the lease had passed to another worker); a message deleted
--   meanwhile takes no attempt;
-- * deleting messages deletes their attempts, in one statement per deleting statement (as ON
--   DELETE CASCADE did, row by row), and emptying the table empties the history.
ALTER TABLE outbox_attempts DROP CONSTRAINT outbox_attempts_outbox_message_id_fkey;

CREATE FUNCTION outbox_delete_attempts() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM outbox_attempts AS a
    USING deleted_messages AS d
    WHERE a.outbox_message_id = d.outbox_message_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER outbox_messages_delete_attempts
    AFTER DELETE ON outbox_messages
    REFERENCING OLD TABLE AS deleted_messages
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_delete_attempts();

CREATE FUNCTION outbox_truncate_attempts() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE outbox_attempts;
    RETURN NULL;
END
$$;

CREATE TRIGGER outbox_messages_truncate_attempts
    AFTER TRUNCATE ON outbox_messages
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_truncate_attempts();
