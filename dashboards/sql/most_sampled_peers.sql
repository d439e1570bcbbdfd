-- Which peers' groups get sampled most, and by whom. `samples` is the sample log
-- (one row per group a node drew); in plain DuckDB:
--   CREATE VIEW samples AS SELECT * FROM read_json('<ledger>/_samples/**/*.jsonl',
--       format = 'newline_delimited', hive_partitioning = true);
SELECT
    swarm_id,
    peer_node_id,
    count(*)                   AS times_sampled,
    count(DISTINCT node_id)    AS sampled_by_nodes,
    count(DISTINCT group_id)   AS distinct_groups
FROM samples
GROUP BY swarm_id, peer_node_id
ORDER BY times_sampled DESC, swarm_id, peer_node_id;
