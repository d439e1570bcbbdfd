-- How far peers' groups are from the receiver, by how many rounds old they were when it
-- trained on them (its round minus the publisher's round of the group): the part of the
-- drift that is policy lag. Per swarm and lag, over the tokens whose generator's log-probs
-- were known and accepted: the mean (generator - receiver) log-prob of the sampled tokens
-- (a per-token KL estimate) and the share of tokens whose ratio the correction cut (under
-- `none`: exceeded its cap). A sampler that draws newer groups first (`fresh`) trains on
-- less lag. Relations: `trainings` (drift_* columns) and `rollouts` (the group's round).
WITH published AS (
    SELECT DISTINCT swarm_id, group_id, node_round AS published_round FROM rollouts
)
SELECT
    t.swarm_id,
    t.node_round - p.published_round                          AS lag_rounds,
    count(*)                                                  AS groups,
    sum(t.drift_tokens)                                       AS tokens,
    sum(t.drift_tokens * t.drift_kl) / sum(t.drift_tokens)    AS kl,
    sum(t.drift_tokens * t.drift_capped) / sum(t.drift_tokens) AS capped
FROM trainings t
JOIN published p ON p.swarm_id = t.swarm_id AND p.group_id = t.group_id
WHERE t.origin = 'external' AND t.trained AND t.drift_tokens > 0
GROUP BY ALL
ORDER BY t.swarm_id, lag_rounds;
