-- What each node trained on, per round: the mean reward of its training set (every group
-- it selected, its own and peers', as its verifier scored them: the paper's training reward,
-- MLflow's `training_reward`) and the completion tokens of the groups the update used
-- (zero-variance groups are dropped before it; counts as their publishers made them:
-- re-encoding by another tokenizer changes them a little).
-- Relations: `trainings` (one row per group a node selected; the ledger's `_trainings/`
-- log) and `rollouts`.
WITH selected AS (
    SELECT DISTINCT ON (swarm_id, node_id, node_round, group_id)
        swarm_id, node_id, node_round, group_id, completions, reward_mean, trained
    FROM trainings
    ORDER BY swarm_id, node_id, node_round, group_id, recorded_at
),
tokens AS (
    SELECT group_id, sum(completion_tokens)::BIGINT AS tokens
    FROM rollouts
    WHERE group_id IN (SELECT group_id FROM selected WHERE trained)
    GROUP BY group_id
)
SELECT
    s.swarm_id,
    s.node_id,
    s.node_round,
    sum(s.reward_mean * s.completions) / nullif(sum(s.completions), 0) AS training_reward,
    coalesce(sum(k.tokens) FILTER (WHERE s.trained), 0)::BIGINT        AS tokens_trained
FROM selected s
LEFT JOIN tokens k USING (group_id)
GROUP BY s.swarm_id, s.node_id, s.node_round
ORDER BY s.swarm_id, s.node_id, s.node_round;
