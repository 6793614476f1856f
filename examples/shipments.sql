-- The examples' business table: one shipment per OrderCompleted event. Nothing in it stops a
-- second row for the same order: only the inbox keeps a redelivered event from shipping twice.
-- Create it beside outbox_inbox (python -m outbox migrate --inbox), with your own migrations.
CREATE TABLE IF NOT EXISTS shipments (
    shipment_id bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id    bigint      NOT NULL,
    webhook_id  text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
