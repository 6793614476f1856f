-- Who acted, from where, and when it ended: each recorded action's caller's address (the first
-- of X-Forwarded-For, else the address the host saw) and user agent (bounded to 200 characters),
-- and when it finished (NULL: under way, or recorded before this migration). actor now names
-- a person where the host says who (App Service Authentication's principal, a named key of
-- `outbox serve`), else "function key" or "cli". Nullable columns without a default: instant on
-- a table of any size, and older relays, which do not write them, keep working.
ALTER TABLE outbox_console_actions
    ADD COLUMN address text,
    ADD COLUMN user_agent text,
    ADD COLUMN finished_at timestamptz;
