-- One row per swarm (a sweep's configuration): cumulative_claimed_reward (the paper's
-- measure: rewards summed over every node and round; here each node-round counts its
-- claimed_reward, the mean over its published completions, so
-- swarms with equal nodes x rounds compare directly), its standard error (node-rounds taken
-- as independent), the mean claimed_reward in the first and last quarter of the rounds, and, for a
-- swarm in an experiment, the gain over that experiment's no-sharing baseline (J = 0).
-- experiment, I, J and policy are the value every node's manifest agrees on: NULL where no
-- node has a manifest or nodes disagree.
-- `sweep_rewards` is the result of sweep_reward_per_round.sql; in plain DuckDB
--   CREATE TABLE sweep_rewards AS <the query of sweep_reward_per_round.sql>;
WITH marked AS (
    SELECT *, max(node_round) OVER (PARTITION BY swarm_id) + 1 AS swarm_rounds
    FROM sweep_rewards
),
per_swarm AS (
    SELECT
        CASE WHEN count(DISTINCT experiment) = 1 THEN any_value(experiment) END
                                                      AS experiment,
        swarm_id,
        CASE WHEN count(DISTINCT local_groups) = 1 THEN any_value(local_groups) END
                                                      AS local_groups,
        CASE WHEN count(DISTINCT external_groups) = 1 THEN any_value(external_groups) END
                                                      AS external_groups,
        CASE WHEN count(DISTINCT policy) = 1 THEN any_value(policy) END
                                                      AS policy,
        count(DISTINCT node_id)                       AS nodes,
        any_value(swarm_rounds)                       AS rounds,
        count(*)                                      AS node_rounds,
        sum(claimed_reward)                              AS cumulative_claimed_reward,
        stddev_samp(claimed_reward) * sqrt(count(*))     AS cumulative_claimed_reward_se,
        avg(claimed_reward) FILTER (WHERE node_round < greatest(swarm_rounds // 4, 1))
                                                      AS first_quarter_mean,
        avg(claimed_reward) FILTER (WHERE node_round >= swarm_rounds - greatest(swarm_rounds // 4, 1))
                                                      AS last_quarter_mean
    FROM marked
    GROUP BY swarm_id
),
baseline AS (
    SELECT experiment, arg_min(cumulative_claimed_reward, swarm_id) AS baseline_reward
    FROM per_swarm
    WHERE experiment IS NOT NULL AND external_groups = 0
    GROUP BY experiment
)
SELECT
    per_swarm.*,
    cumulative_claimed_reward / baseline_reward - 1 AS gain_over_baseline
FROM per_swarm LEFT JOIN baseline USING (experiment)
ORDER BY experiment NULLS LAST, external_groups, policy, swarm_id;
