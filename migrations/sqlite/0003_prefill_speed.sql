-- What each worker measured of its own prefill speed at start, and the
-- deadline it promises: the control plane checks every context window
-- against them (NULL: a worker that registered none is never routable).

ALTER TABLE nodes ADD COLUMN prefill_ns_per_token BIGINT;
ALTER TABLE nodes ADD COLUMN prefill_ns_per_pair BIGINT;
ALTER TABLE nodes ADD COLUMN prefill_deadline_ms BIGINT;
