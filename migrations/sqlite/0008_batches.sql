-- Batches (OpenAI's `/v1/batches`): a tenant's input file's lines, run by
-- the batch runner through the gateway. The lines are copied in at
-- creation (the input file may be deleted while the batch runs), and each
-- line's answer is written once, keyed by (batch, line), so a runner that
-- dies and restarts adds no second answer and the output file holds one
-- line per input line. `lease_until` is when the runner that holds the
-- batch must have renewed it by; after it, another may take it. A line
-- is numbered by its place among the input's non-empty lines, from 0.
--
-- The runner calls the gateway as the batch's account with an API token
-- made for that batch when it takes it (`api_tokens.batch_id`), revoked
-- when it is taken again or finished: the gateway runs such a token's
-- calls in the batch class and bills each line under one call id however
-- often it runs.

CREATE TABLE batches (
    id                 TEXT PRIMARY KEY,
    account_id         TEXT NOT NULL,
    input_file_id      TEXT NOT NULL,
    endpoint           TEXT NOT NULL,
    completion_window  TEXT NOT NULL,
    metadata           TEXT,
    status             TEXT NOT NULL,
    errors             TEXT NOT NULL,
    input              TEXT NOT NULL,
    total              BIGINT NOT NULL,
    output_file_id     TEXT,
    error_file_id      TEXT,
    created_at         BIGINT NOT NULL,
    expires_at         BIGINT NOT NULL,
    in_progress_at     BIGINT,
    finalizing_at      BIGINT,
    completed_at       BIGINT,
    failed_at          BIGINT,
    expired_at         BIGINT,
    cancelling_at      BIGINT,
    cancelled_at       BIGINT,
    lease_until        BIGINT
);

CREATE INDEX batches_by_account ON batches (account_id, created_at);
CREATE INDEX batches_by_status ON batches (status);

CREATE TABLE batch_results (
    batch_id     TEXT NOT NULL REFERENCES batches (id) ON DELETE CASCADE,
    line         BIGINT NOT NULL,
    custom_id    TEXT NOT NULL,
    status_code  BIGINT NOT NULL,
    request_id   TEXT,
    body         TEXT NOT NULL,
    PRIMARY KEY (batch_id, line)
);

ALTER TABLE api_tokens ADD COLUMN batch_id TEXT;

-- A call may bill under a key beside its id (a batch line: one key however
-- often the line runs); the ledger keeps one event per key.
ALTER TABLE usage_events ADD COLUMN billing_key TEXT;
CREATE UNIQUE INDEX usage_events_by_billing_key ON usage_events (billing_key);
