-- Discoveries and how they spread: for every node and task, the first round in which the
-- node's own completions earned reward on that task (NULL: never), and what it had trained
-- on before then: informative peer groups of the same task (how many, from which peers).
-- A discovery that spread looks like: a peer's informative groups of task T trained on in
-- rounds < first_round, then the node's own first reward on T.
-- Relations: `rollouts` (own completions, claimed rewards: a node's claim is its own
-- verifier's) and `trainings`.
WITH own AS (
    SELECT swarm_id, node_id, task,
           min(node_round) FILTER (WHERE reward > 0) AS first_round,
           max(node_round) + 1                       AS rounds_seen
    FROM rollouts
    GROUP BY swarm_id, node_id, task
),
peer_groups AS (
    SELECT DISTINCT swarm_id, node_id, node_round, group_id, task, peer_node_id
    FROM trainings
    WHERE origin = 'external' AND informative AND trained
)
SELECT
    own.swarm_id,
    own.node_id,
    own.task,
    own.first_round,
    own.rounds_seen,
    count(p.group_id)                                AS peer_groups_before,
    string_agg(DISTINCT p.peer_node_id, ',' ORDER BY p.peer_node_id) AS from_peers
FROM own
LEFT JOIN peer_groups p
    ON p.swarm_id = own.swarm_id AND p.node_id = own.node_id AND p.task = own.task
   AND p.node_round < coalesce(own.first_round, own.rounds_seen)
GROUP BY ALL
ORDER BY own.swarm_id, own.node_id, own.task;
