-- One line per swarm: the paper's headline number, cumulative_claimed_reward (the sum over
-- nodes and rounds of each node's claimed_reward: the mean reward its published completions
-- claim in a round), with the node and round counts behind it.
WITH per_round AS (
    SELECT swarm_id, node_id, node_round, avg(reward) AS claimed_reward
    FROM rollouts
    GROUP BY swarm_id, node_id, node_round
)
SELECT
    swarm_id,
    count(DISTINCT node_id)   AS nodes,
    max(node_round) + 1       AS rounds,
    sum(claimed_reward)          AS cumulative_claimed_reward
FROM per_round
GROUP BY swarm_id
ORDER BY swarm_id;
