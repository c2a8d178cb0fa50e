-- Tenant API tokens: scoped to one account, revocable, stored as sha256.

CREATE TABLE api_tokens (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id    TEXT NOT NULL REFERENCES accounts (id),
    name          TEXT NOT NULL,
    token_sha256  TEXT NOT NULL UNIQUE,
    created_at    BIGINT NOT NULL,
    revoked_at    BIGINT
);

CREATE INDEX api_tokens_by_account ON api_tokens (account_id);
