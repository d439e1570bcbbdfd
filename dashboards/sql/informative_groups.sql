-- The mechanism, per node and round: how many of the groups a node trained on carried a
-- gradient (informative: its verifier's rewards were not all equal), and how many of those
-- came from peers. Sharing can only help where peers' informative groups arrive.
-- Relation: `trainings` (one row per group a node selected for its training set; the
-- ledger's `_trainings/` log).
SELECT
    swarm_id,
    node_id,
    node_round,
    count(*)                                                        AS groups_selected,
    count(*) FILTER (WHERE informative AND trained)                 AS informative_trained,
    count(*) FILTER (WHERE informative AND trained AND origin = 'local')
                                                                    AS informative_local,
    count(*) FILTER (WHERE informative AND trained AND origin = 'external')
                                                                    AS informative_external,
    count(*) FILTER (WHERE origin = 'external')                     AS external_selected
FROM (
    SELECT DISTINCT ON (swarm_id, node_id, node_round, group_id) *
    FROM trainings
    ORDER BY swarm_id, node_id, node_round, group_id, recorded_at
)
GROUP BY swarm_id, node_id, node_round
ORDER BY swarm_id, node_id, node_round;
