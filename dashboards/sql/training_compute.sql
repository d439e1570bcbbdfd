-- What each node trained on, per round: the mean reward of its training set (its own and
-- peers' groups as its verifier scored them: the paper's training reward) and the completion
-- tokens it trained on (as their publishers counted them; re-encoding by another tokenizer
-- changes the count a little).
-- Relations: `trainings` (one row per group a node considered; the ledger's `_trainings/`
-- log) and `rollouts`.
WITH trained AS (
    SELECT DISTINCT ON (swarm_id, node_id, node_round, group_id)
        swarm_id, node_id, node_round, group_id, completions, reward_mean
    FROM trainings
    WHERE trained
    ORDER BY swarm_id, node_id, node_round, group_id, recorded_at
),
tokens AS (
    SELECT group_id, sum(completion_tokens) AS tokens
    FROM rollouts
    WHERE group_id IN (SELECT group_id FROM trained)
    GROUP BY group_id
)
SELECT
    t.swarm_id,
    t.node_id,
    t.node_round,
    sum(t.reward_mean * t.completions) / nullif(sum(t.completions), 0) AS training_reward,
    coalesce(sum(k.tokens), 0)                                          AS tokens_trained
FROM trained t
LEFT JOIN tokens k USING (group_id)
GROUP BY t.swarm_id, t.node_id, t.node_round
ORDER BY t.swarm_id, t.node_id, t.node_round;
