-- A sharing sweep, per node and round: the mean reward of the node's own completions
-- (what it generated and published that round, scored by its verifier), with the
-- configuration read back from the swarm id `<experiment>-<I>x<J>[-<policy>]` that
-- `sapo experiment` gives each configuration. Swarms named otherwise are left out.
-- In plain DuckDB, define `rollouts` as in reward_per_node_round.sql.
WITH parsed AS (
    SELECT *, regexp_extract(swarm_id, '^(.+)-(\d+)x(\d+)(?:-([a-z][a-z-]*))?$',
                             ['experiment', 'i', 'j', 'policy']) AS conf
    FROM rollouts
)
SELECT
    conf.experiment                                   AS experiment,
    swarm_id,
    CAST(conf.i AS INTEGER)                           AS local_groups,
    CAST(conf.j AS INTEGER)                           AS external_groups,
    coalesce(NULLIF(conf.policy, ''), 'paper')        AS policy,
    node_id,
    node_round,
    avg(reward)                                       AS reward_mean,
    count(*)                                          AS completions
FROM parsed
WHERE conf.experiment <> ''
GROUP BY ALL
ORDER BY experiment, swarm_id, node_id, node_round;
