-- Tenants' uploaded files (OpenAI's `/v1/files`, purpose `batch`). The
-- bytes live in the database beside their metadata, so a file survives a
-- restart of any component and every control plane sees the same. A file
-- is JSON Lines (UTF-8 text, no NUL), at most 2,000,000 bytes and 10,000
-- lines, checked by the gateway and again by the control plane before it
-- is written. Every read and delete names the account as well as the id, so
-- another account's file is found exactly as an unknown one is: not.

CREATE TABLE files (
    id          TEXT PRIMARY KEY,
    account_id  TEXT NOT NULL,
    purpose     TEXT NOT NULL,
    filename    TEXT NOT NULL,
    bytes       BIGINT NOT NULL,
    lines       BIGINT NOT NULL,
    created_at  BIGINT NOT NULL,
    content     TEXT NOT NULL
);

CREATE INDEX files_by_account ON files (account_id, created_at);
