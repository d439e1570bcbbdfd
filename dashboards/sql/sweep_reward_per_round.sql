-- Every swarm, per node and round: claimed_reward, the mean reward of the node's own
-- completions as it published them (scored by its verifier), with the node's sharing
-- configuration from its manifest: experiment, I (local_groups), J (external_groups) and
-- sampling policy. A node without a manifest (ledgers written before manifests existed)
-- keeps its rows, with those columns NULL; experiment is NULL outside `sapo experiment`.
-- Relations: `rollouts` (one row per completion) and `manifests` (one row per node). In a
-- plain DuckDB session define them as
--   CREATE VIEW rollouts AS SELECT * FROM read_parquet('<ledger>/**/*.parquet',
--       hive_partitioning = true, union_by_name = true);
--   CREATE VIEW manifests AS SELECT *,
--       count(*) OVER (PARTITION BY swarm_id, node_id) AS revisions
--     FROM read_json('<ledger>/_manifests/*/*/*.jsonl',
--       format = 'newline_delimited',
--       columns = {swarm_id: 'VARCHAR', node_id: 'VARCHAR', experiment: 'VARCHAR',
--                  local_groups: 'INTEGER', external_groups: 'INTEGER', policy: 'VARCHAR',
--                  policy_params: 'VARCHAR', model_id: 'VARCHAR', prompt_format: 'VARCHAR',
--                  adapter: 'VARCHAR', seed: 'BIGINT', written_at: 'TIMESTAMPTZ', schema_version: 'INTEGER'})
--   QUALIFY row_number() OVER (PARTITION BY swarm_id, node_id ORDER BY written_at) = 1;
-- (on a ledger without any manifest: CREATE TABLE manifests (swarm_id VARCHAR,
--  node_id VARCHAR, experiment VARCHAR, local_groups INTEGER, external_groups INTEGER,
--  policy VARCHAR, model_id VARCHAR, prompt_format VARCHAR, adapter VARCHAR,
--  revisions BIGINT)).
WITH per_round AS (
    SELECT swarm_id, node_id, node_round, avg(reward) AS claimed_reward, count(*) AS completions
    FROM rollouts
    GROUP BY swarm_id, node_id, node_round
)
SELECT
    m.experiment,
    r.swarm_id,
    m.local_groups,
    m.external_groups,
    m.policy,
    r.node_id,
    r.node_round,
    r.claimed_reward,
    r.completions
FROM per_round r
LEFT JOIN manifests m ON m.swarm_id = r.swarm_id AND m.node_id = r.node_id
ORDER BY r.swarm_id, r.node_id, r.node_round;
