-- Control plane schema (SQLite). Keep in step with ../postgres: same tables,
-- columns and version numbers; only identity columns, triggers and types of
-- dialect differ. Times are milliseconds since the Unix epoch; booleans are
-- INTEGER 0/1 (the sqlx Any driver cannot decode SQLite BOOLEAN).

CREATE TABLE accounts (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);

CREATE TABLE operators (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    name          TEXT NOT NULL UNIQUE,
    role          TEXT NOT NULL CHECK (role IN ('responder', 'admin', 'node', 'gateway')),
    token_sha256  TEXT NOT NULL UNIQUE,
    created_at    BIGINT NOT NULL,
    revoked_at    BIGINT
);

CREATE TABLE models (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    slug              TEXT NOT NULL UNIQUE,
    task              TEXT NOT NULL,
    description       TEXT NOT NULL,
    visibility        TEXT NOT NULL CHECK (visibility IN ('public', 'private')),
    listed            INTEGER NOT NULL,
    component_status  TEXT NOT NULL CHECK (component_status IN
                        ('operational', 'degraded_performance', 'partial_outage', 'major_outage', 'under_maintenance')),
    active_config     BIGINT,
    created_at        BIGINT NOT NULL,
    updated_at        BIGINT NOT NULL
);

CREATE TABLE model_allowlist (
    model_id    BIGINT NOT NULL REFERENCES models (id),
    account_id  TEXT NOT NULL REFERENCES accounts (id),
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (model_id, account_id)
);

CREATE TABLE model_configs (
    model_id           BIGINT NOT NULL REFERENCES models (id),
    version            BIGINT NOT NULL,
    context_window     BIGINT NOT NULL,
    max_output         BIGINT NOT NULL,
    weights_file       TEXT NOT NULL,
    weights_sha256     TEXT NOT NULL,
    quantization       TEXT NOT NULL,
    page_size          BIGINT NOT NULL,
    prefill_kv_bytes   BIGINT NOT NULL,
    decode_kv_bytes    BIGINT NOT NULL,
    tensor_parallel    BIGINT NOT NULL,
    pipeline_parallel  BIGINT NOT NULL,
    created_by         TEXT NOT NULL,
    created_at         BIGINT NOT NULL,
    activated_at       BIGINT,
    PRIMARY KEY (model_id, version)
);

CREATE TABLE nodes (
    id                 INTEGER PRIMARY KEY AUTOINCREMENT,
    name               TEXT NOT NULL UNIQUE,
    operator_id        BIGINT NOT NULL REFERENCES operators (id),
    role               TEXT NOT NULL CHECK (role IN ('prefill', 'decode', 'colocated')),
    model_id           BIGINT NOT NULL REFERENCES models (id),
    address            TEXT NOT NULL,
    transfer_address   TEXT,
    kv_pool_tokens     BIGINT NOT NULL,
    weights_sha256     TEXT NOT NULL,
    quantization       TEXT NOT NULL,
    page_size          BIGINT NOT NULL,
    kv_budget_bytes    BIGINT NOT NULL,
    tensor_parallel    BIGINT NOT NULL,
    pipeline_parallel  BIGINT NOT NULL,
    free_pages         BIGINT,
    total_pages        BIGINT,
    queue_depth        BIGINT,
    registered_at      BIGINT NOT NULL,
    last_seen_at       BIGINT NOT NULL
);

CREATE TABLE audit_log (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    at       BIGINT NOT NULL,
    actor    TEXT NOT NULL,
    action   TEXT NOT NULL,
    subject  TEXT NOT NULL,
    reason   TEXT NOT NULL,
    before   TEXT NOT NULL,
    after    TEXT NOT NULL
);

-- The audit log is append-only for every client of the database, not only
-- for the API: updates and deletes abort.
CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
BEGIN
    SELECT RAISE(ABORT, 'audit_log is append-only');
END;

CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
BEGIN
    SELECT RAISE(ABORT, 'audit_log is append-only');
END;

CREATE TABLE incidents (
    id                       INTEGER PRIMARY KEY AUTOINCREMENT,
    name                     TEXT NOT NULL,
    status                   TEXT NOT NULL CHECK (status IN
                               ('investigating', 'identified', 'monitoring', 'resolved', 'postmortem')),
    impact                   TEXT NOT NULL CHECK (impact IN ('none', 'minor', 'major', 'critical')),
    created_at               BIGINT NOT NULL,
    updated_at               BIGINT NOT NULL,
    monitoring_at            BIGINT,
    resolved_at              BIGINT,
    postmortem_body          TEXT,
    postmortem_published_at  BIGINT
);

CREATE TABLE incident_updates (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    incident_id  BIGINT NOT NULL REFERENCES incidents (id),
    status       TEXT NOT NULL,
    body         TEXT NOT NULL,
    actor        TEXT NOT NULL,
    created_at   BIGINT NOT NULL
);

CREATE TABLE incident_update_components (
    update_id   BIGINT NOT NULL REFERENCES incident_updates (id),
    model_id    BIGINT NOT NULL REFERENCES models (id),
    old_status  TEXT NOT NULL,
    new_status  TEXT NOT NULL,
    PRIMARY KEY (update_id, model_id)
);

CREATE INDEX incident_updates_by_incident ON incident_updates (incident_id);
CREATE INDEX nodes_by_model ON nodes (model_id);
