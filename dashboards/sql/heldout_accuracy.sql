-- Held-out accuracy of every node at every evaluation: the policy at the start of
-- `node_round` (after that many updates) on the fixed evaluation set, per task and overall
-- (the mean over tasks, each task weighing the same). One row per swarm, node, round.
-- Relation: `evaluations` (one row per node, evaluation and task; the ledger's
-- `_evaluations/` log). In plain DuckDB:
--   CREATE VIEW evaluations AS SELECT * FROM read_json('<ledger>/_evaluations/**/*.jsonl',
--     format = 'newline_delimited', hive_partitioning = true,
--     columns = {node_round: 'BIGINT', task: 'VARCHAR', questions: 'BIGINT',
--                completions: 'BIGINT', correct: 'DOUBLE', accuracy: 'DOUBLE',
--                policy_version: 'BIGINT', eval_seed: 'BIGINT',
--                evaluated_at: 'TIMESTAMPTZ'});
WITH once AS (
    -- a node writes one file per evaluation; keep one row per task even if a file repeats
    SELECT DISTINCT ON (swarm_id, node_id, node_round, task)
        swarm_id, node_id, node_round, task, correct, completions, accuracy
    FROM evaluations
    ORDER BY swarm_id, node_id, node_round, task, evaluated_at
)
SELECT
    swarm_id,
    node_id,
    node_round,
    avg(accuracy)                                   AS accuracy,
    sum(correct)::BIGINT                            AS correct,
    sum(completions)::BIGINT                        AS completions,
    count(*)                                        AS tasks,
    map(list(task ORDER BY task), list(accuracy ORDER BY task)) AS accuracy_by_task
FROM once
GROUP BY swarm_id, node_id, node_round
ORDER BY swarm_id, node_id, node_round;
