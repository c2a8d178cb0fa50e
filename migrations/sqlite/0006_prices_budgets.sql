-- Prices and budgets: a model config's price in neurons per million
-- prompt and output tokens; an account's daily and monthly budgets in
-- neurons (NULL: unlimited) and its free allowance per day; and each usage
-- event's cost in micro-neurons at the price in force when it was
-- recorded, rolled up per day.

ALTER TABLE model_configs ADD COLUMN input_neurons_per_mtok BIGINT NOT NULL DEFAULT 0;
ALTER TABLE model_configs ADD COLUMN output_neurons_per_mtok BIGINT NOT NULL DEFAULT 0;

ALTER TABLE accounts ADD COLUMN daily_budget_neurons BIGINT;
ALTER TABLE accounts ADD COLUMN monthly_budget_neurons BIGINT;
ALTER TABLE accounts ADD COLUMN free_neurons_per_day BIGINT NOT NULL DEFAULT 10000;

ALTER TABLE usage_events ADD COLUMN micro_neurons BIGINT NOT NULL DEFAULT 0;
ALTER TABLE usage_daily ADD COLUMN micro_neurons BIGINT NOT NULL DEFAULT 0;
