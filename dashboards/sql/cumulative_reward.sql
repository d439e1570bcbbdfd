-- Cumulative reward per node: the running sum over rounds of the node's mean reward per
-- round (the paper sums rewards over all agents and rounds; the last row per swarm is that
-- total when every node published every round).
WITH per_round AS (
    SELECT swarm_id, node_id, node_round, avg(reward) AS reward_mean
    FROM rollouts
    GROUP BY swarm_id, node_id, node_round
)
SELECT
    swarm_id,
    node_id,
    node_round,
    reward_mean,
    sum(reward_mean) OVER (
        PARTITION BY swarm_id, node_id ORDER BY node_round
        ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW
    ) AS cumulative_reward
FROM per_round
ORDER BY swarm_id, node_id, node_round;
