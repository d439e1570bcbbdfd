-- One line per swarm: the paper's headline number (sum over nodes and rounds of each
-- node's mean reward per round), with the node and round counts behind it.
WITH per_round AS (
    SELECT swarm_id, node_id, node_round, avg(reward) AS reward_mean
    FROM rollouts
    GROUP BY swarm_id, node_id, node_round
)
SELECT
    swarm_id,
    count(DISTINCT node_id)   AS nodes,
    max(node_round) + 1       AS rounds,
    sum(reward_mean)          AS cumulative_reward
FROM per_round
GROUP BY swarm_id
ORDER BY swarm_id;
