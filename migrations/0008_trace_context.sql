-- The producer's W3C trace context ({"traceparent": ..., "tracestate": ...}), captured at enqueue
-- when the producer has an active span; NULL otherwise. The relay continues that trace when it
-- delivers the message. A nullable column without a default: added without rewriting the table.
ALTER TABLE outbox_messages ADD COLUMN trace_context jsonb;
