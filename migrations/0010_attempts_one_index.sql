-- One index on the attempt history instead of two: the primary key is now (outbox_message_id,
-- attempt_id), the order in which every reader looks attempts up (a message's attempts, oldest
-- first; the lost-reply check; the cascade from outbox_messages). attempt_id stays an identity
-- column, unique as before; each recorded attempt now writes one index entry instead of two.
ALTER TABLE outbox_attempts DROP CONSTRAINT outbox_attempts_pkey;
ALTER TABLE outbox_attempts
    ADD CONSTRAINT outbox_attempts_pkey PRIMARY KEY (outbox_message_id, attempt_id);
DROP INDEX outbox_attempts_message_idx;
