-- probeok schema: the first answer token of a probe (a reasoning model's `ttft_ms` counts its
-- reasoning tokens), and whether `max_tokens` ran out before any answer arrived. Older rows
-- have neither: NULL and 0.
ALTER TABLE outcomes ADD COLUMN first_answer_ms REAL;
ALTER TABLE outcomes ADD COLUMN max_tokens_exhausted INTEGER NOT NULL DEFAULT 0
    CHECK (max_tokens_exhausted IN (0, 1));
