-- Every swarm, per round: the share of the groups its nodes published whose rewards all
-- agree (zero advantage under GRPO: nothing to learn from, nothing to share).
-- In plain DuckDB build `groups` from rollouts as zero_variance_groups.sql shows.
SELECT
    swarm_id,
    node_round,
    count(*)                                                  AS groups,
    avg(CASE WHEN reward_max = reward_min THEN 1 ELSE 0 END)  AS zero_variance_fraction
FROM groups
GROUP BY swarm_id, node_round
ORDER BY swarm_id, node_round;
