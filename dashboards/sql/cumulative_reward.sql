-- cumulative_claimed_reward per node: the running sum over rounds of its claimed_reward
-- (the mean reward its published completions claim in a round) (the paper sums rewards over all agents and rounds; the last row per swarm is that
-- total when every node published every round).
WITH per_round AS (
    SELECT swarm_id, node_id, node_round, avg(reward) AS claimed_reward
    FROM rollouts
    GROUP BY swarm_id, node_id, node_round
)
SELECT
    swarm_id,
    node_id,
    node_round,
    claimed_reward,
    sum(claimed_reward) OVER (
        PARTITION BY swarm_id, node_id ORDER BY node_round
        ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW
    ) AS cumulative_claimed_reward
FROM per_round
ORDER BY swarm_id, node_id, node_round;
