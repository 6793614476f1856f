-- outbox: no-transaction
-- The attempt history by finish time, as a BRIN index: attempts are only appended, so finish
-- times follow the table's pages, and a summary per range of pages finds the last hour's attempts
-- (the console's rates, `endpoints`) without reading the history whole. A BRIN index writes
-- nothing when a row is appended to a range not yet summarised (docs/performance.md, "The console
-- at scale"); built without blocking the relay.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_attempts_finished_idx
    ON outbox_attempts USING brin (finished_at) WITH (autosummarize = on);
