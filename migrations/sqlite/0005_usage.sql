-- Usage metering: one event per worker call, as the worker counted it
-- (prompt tokens once admitted, output tokens as emitted, whether or not
-- the client stayed), keyed by the call's single-use id so a repeated
-- report counts once; and the roll-up per account, model and UTC day
-- that the usage routes read, updated in the same transaction.

CREATE TABLE usage_events (
    call_id            TEXT PRIMARY KEY,
    account_id         TEXT NOT NULL,
    model              TEXT NOT NULL,
    day                BIGINT NOT NULL,
    prompt_tokens      BIGINT NOT NULL,
    completion_tokens  BIGINT NOT NULL,
    finish             TEXT NOT NULL,
    node               TEXT NOT NULL,
    at                 BIGINT NOT NULL
);

CREATE TABLE usage_daily (
    account_id         TEXT NOT NULL,
    model              TEXT NOT NULL,
    day                BIGINT NOT NULL,
    requests           BIGINT NOT NULL,
    prompt_tokens      BIGINT NOT NULL,
    completion_tokens  BIGINT NOT NULL,
    PRIMARY KEY (account_id, model, day)
);
