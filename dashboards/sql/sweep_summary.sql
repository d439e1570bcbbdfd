-- A sharing sweep, per configuration: cumulative reward (the paper's measure: rewards
-- summed over every node and round; here each node-round counts its mean reward, so
-- configurations with equal nodes x rounds compare directly), its standard error (node-
-- rounds taken as independent), the mean reward in the first and last quarter of the
-- rounds, and the gain over the experiment's no-sharing baseline (J = 0).
-- `sweep_rewards` is the result of sweep_reward_per_round.sql.
WITH marked AS (
    SELECT *, max(node_round) OVER (PARTITION BY swarm_id) + 1 AS swarm_rounds
    FROM sweep_rewards
),
per_conf AS (
    SELECT
        experiment, swarm_id, local_groups, external_groups, policy,
        count(DISTINCT node_id)                       AS nodes,
        any_value(swarm_rounds)                       AS rounds,
        count(*)                                      AS node_rounds,
        sum(reward_mean)                              AS cumulative_reward,
        stddev_samp(reward_mean) * sqrt(count(*))     AS cumulative_reward_se,
        avg(reward_mean) FILTER (WHERE node_round < greatest(swarm_rounds // 4, 1))
                                                      AS first_quarter_mean,
        avg(reward_mean) FILTER (WHERE node_round >= swarm_rounds - greatest(swarm_rounds // 4, 1))
                                                      AS last_quarter_mean
    FROM marked
    GROUP BY ALL
),
baseline AS (
    SELECT experiment, any_value(cumulative_reward) AS baseline_reward
    FROM per_conf
    WHERE external_groups = 0
    GROUP BY experiment
)
SELECT
    per_conf.*,
    cumulative_reward / baseline_reward - 1 AS gain_over_baseline
FROM per_conf LEFT JOIN baseline USING (experiment)
ORDER BY experiment, external_groups, policy;
