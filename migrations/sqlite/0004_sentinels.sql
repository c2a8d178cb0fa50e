-- Sentinel accounts: the platform's own, which the leak prober calls
-- models with as a tenant would. Marked so that they are told apart from
-- tenants wherever accounts are listed or counted (1: a sentinel).

ALTER TABLE accounts ADD COLUMN sentinel INTEGER NOT NULL DEFAULT 0;
