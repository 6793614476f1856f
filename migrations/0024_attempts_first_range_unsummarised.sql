-- The attempt history's BRIN index (0018) was built on an empty table, which PostgreSQL
-- summarises as one empty range: every attempt appended to the first 128 pages (about 6,400
-- attempts) then widened that summary, about 60-70 bytes of WAL each, where a range without a
-- summary writes nothing until it is full and autovacuum summarises it once (autosummarize). So
-- the first range loses its summary while the table is still inside it (a new installation);
-- a table past it keeps its summaries. The plain layout only: a partitioned one's parent index
-- has no ranges of its own. Takes no lock that a producer or a relay waits for.
SELECT brin_desummarize_range('outbox_attempts_finished_idx'::regclass, 0)
FROM pg_class AS t
WHERE t.oid = 'outbox_attempts'::regclass
  AND t.relkind = 'r'
  AND to_regclass('outbox_attempts_finished_idx') IS NOT NULL
  AND pg_relation_size(t.oid) < 128 * current_setting('block_size')::bigint;
