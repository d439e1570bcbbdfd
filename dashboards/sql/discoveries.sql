-- Discoveries and how they spread: for every node and task it drew, the first round it drew
-- the task, the first round in which its own completions earned reward on it (NULL: never),
-- and what it had trained on before then: informative peer groups of the same task (how
-- many, from which peers). A discovery is first_round > first_drawn (the node drew the task
-- and failed before it succeeded); one that may have spread from peers has peer groups of
-- the task trained in rounds < first_round. With J = 0 there are none by construction: the
-- comparison with J = 0 is what says whether they made a difference.
-- Relations: `rollouts` (own completions, claimed rewards: a node's claim is its own
-- verifier's) and `trainings`.
WITH own AS (
    SELECT swarm_id, node_id, task,
           min(node_round)                            AS first_drawn,
           min(node_round) FILTER (WHERE reward > 0)  AS first_round,
           any_value(rounds_seen)                     AS rounds_seen
    FROM (SELECT *, max(node_round) OVER (PARTITION BY swarm_id, node_id) + 1 AS rounds_seen
          FROM rollouts)
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
    own.first_drawn,
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
