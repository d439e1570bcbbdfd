-- claimed_reward: the mean reward each node's published completions claim, per round (its
-- own completions, scored by its verifier: for an honest node, MLflow's own_reward).
-- Relations: `rollouts` (one row per completion). In a plain DuckDB session, define it as
--   CREATE VIEW rollouts AS SELECT * FROM read_parquet('<ledger>/**/*.parquet',
--       hive_partitioning = true, union_by_name = true);
SELECT
    swarm_id,
    node_id,
    node_round,
    avg(reward)               AS claimed_reward,
    count(DISTINCT group_id)  AS groups,
    count(*)                  AS completions,
    sum(completion_tokens)::BIGINT AS tokens_generated  -- an integer, not a 128-bit sum
FROM rollouts
GROUP BY swarm_id, node_id, node_round
ORDER BY swarm_id, node_id, node_round;
