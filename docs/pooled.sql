-- Both paper-cpu sweeps pooled: cumulative reward per configuration, per seed set and
-- pooled, with the pooled gain over 4/0. Each node's experiment, I, J and sampling policy
-- come from its manifest (the `manifests` view; see ledger/manifests.py for plain DuckDB).
WITH per_round AS (
    SELECT m.experiment, m.local_groups AS i, m.external_groups AS j,
           CASE WHEN m.external_groups = 0 OR m.policy = 'paper' THEN ''
                ELSE ' ' || replace(m.policy, '_', '-') END AS policy,
           r.swarm_id, r.node_id, r.node_round, avg(r.reward) AS reward_mean
    FROM rollouts r JOIN manifests m ON m.swarm_id = r.swarm_id AND m.node_id = r.node_id
    WHERE m.experiment IN ('paper-cpu', 'paper-cpu-s10')
    GROUP BY ALL
),
per_conf AS (
    SELECT i || '/' || j || policy                                        AS configuration,
           j,
           sum(reward_mean) FILTER (WHERE experiment = 'paper-cpu')       AS seeds_0_2,
           sum(reward_mean) FILTER (WHERE experiment = 'paper-cpu-s10')   AS seeds_10_12,
           sum(reward_mean)                                               AS pooled
    FROM per_round GROUP BY configuration, j
)
SELECT configuration, round(seeds_0_2, 2) AS seeds_0_2, round(seeds_10_12, 2) AS seeds_10_12,
       round(pooled, 2) AS pooled,
       round(100 * (pooled / (SELECT pooled FROM per_conf WHERE j = 0) - 1), 1) AS pooled_gain_pct
FROM per_conf ORDER BY j, configuration
