-- How far has each peer drifted from me? Per node, round and publisher whose groups it
-- trained on (itself included: its own generator against its trainer), over the tokens
-- whose generator's log-probs were known and accepted (sapo_core/claims.py):
--   kl            mean (generator - me) log-prob of the sampled tokens, a per-token
--                 estimate of KL(generator || me): 0 for one's own exact rows, growing as
--                 a peer's policy moves away;
--   ess_fraction  effective sample size of the token importance ratios (me / generator)
--                 as a fraction of the tokens: 1 when they are all equal, near 0 when a few
--                 tokens would carry the whole correction;
--   capped        share of tokens the correction truncated or masked (under `none`: those
--                 whose ratio exceeded the cap);
--   weight_mean, weight_sq_mean
--                 the token-weighted means of the ratios and of their squares, from which
--                 the ESS of any pool of rows follows: (sum tokens*weight_mean)^2 /
--                 (sum tokens * sum tokens*weight_sq_mean) (run records keep these).
-- Relation: `trainings` (the training log's drift_* columns; rows written before them, or
-- with no claim, are left out).
SELECT
    swarm_id,
    node_id,
    node_round,
    peer_node_id,
    any_value(origin)                                       AS origin,
    sum(drift_tokens)                                       AS tokens,
    sum(drift_tokens * drift_kl) / sum(drift_tokens)        AS kl,
    least(
        pow(sum(drift_tokens * drift_weight_mean), 2)
            / nullif(sum(drift_tokens) * sum(drift_tokens * drift_weight_sq_mean), 0),
        1.0
    )                                                       AS ess_fraction,
    sum(drift_tokens * drift_capped) / sum(drift_tokens)    AS capped,
    sum(drift_tokens * drift_weight_mean) / sum(drift_tokens)    AS weight_mean,
    sum(drift_tokens * drift_weight_sq_mean) / sum(drift_tokens) AS weight_sq_mean
FROM trainings
WHERE trained AND drift_tokens > 0
GROUP BY swarm_id, node_id, node_round, peer_node_id
ORDER BY swarm_id, node_id, node_round, origin DESC, peer_node_id;
