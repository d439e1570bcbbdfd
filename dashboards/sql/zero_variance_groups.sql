-- Share of each node's groups whose rewards all agree (no learning signal under GRPO).
-- `groups` has one row per group; in plain DuckDB build it from rollouts:
--   CREATE VIEW groups AS
--   SELECT group_id, any_value(swarm_id) AS swarm_id, any_value(node_id) AS node_id,
--          any_value(node_round) AS node_round,
--          min(reward) AS reward_min, max(reward) AS reward_max
--   FROM rollouts GROUP BY group_id;
SELECT
    swarm_id,
    node_id,
    count(*)                                            AS groups,
    avg(CASE WHEN reward_max = reward_min THEN 1 ELSE 0 END) AS zero_variance_fraction
FROM groups
GROUP BY swarm_id, node_id
ORDER BY swarm_id, node_id;
