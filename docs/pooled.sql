WITH per_round AS (
    SELECT regexp_extract(swarm_id, '^(.+)-(\d+)x(\d+)(?:-([a-z][a-z-]*))?$',
                          ['experiment', 'i', 'j', 'policy']) AS c,
           node_id, node_round, avg(reward) AS r
    FROM rollouts
    WHERE swarm_id LIKE 'paper-cpu-%'
    GROUP BY ALL
),
per_conf AS (
    SELECT c.i || '/' || c.j || CASE WHEN c.policy = '' THEN '' ELSE ' ' || c.policy END AS configuration,
           c.j::INT AS j,
           sum(r) FILTER (WHERE c.experiment = 'paper-cpu')     AS seeds_0_2,
           sum(r) FILTER (WHERE c.experiment = 'paper-cpu-s10') AS seeds_10_12,
           sum(r) AS pooled
    FROM per_round GROUP BY ALL
)
SELECT configuration, round(seeds_0_2, 2) AS seeds_0_2, round(seeds_10_12, 2) AS seeds_10_12,
       round(pooled, 2) AS pooled,
       round(100 * (pooled / (SELECT pooled FROM per_conf WHERE j = 0) - 1), 1) AS pooled_gain_pct
FROM per_conf ORDER BY j, configuration
