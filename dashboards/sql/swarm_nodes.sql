-- One row per node of every swarm: what its manifest declares (experiment, I, J, sampling
-- policy, model, prompt format, adapter; NULL for a node without a manifest), the rounds it published, its
-- cumulative_claimed_reward (the sum of its claimed_reward per round), the share of its groups whose
-- rewards all agree, and how many groups it drew from how many peers (sample log).
-- `manifest_revisions` > 1: the node was resumed with another configuration (the first
-- one is shown; `configurations` lists each, `I/J policy from round R`, in order).
-- Relations: `rollouts`, `manifests` (see sweep_reward_per_round.sql), `groups` (see
-- zero_variance_groups.sql), `samples` (see most_sampled_peers.sql) and
-- `manifest_revisions`, in a plain DuckDB session (after `rollouts`)
--   CREATE VIEW manifest_revisions AS SELECT m.*,
--       row_number() OVER (PARTITION BY swarm_id, node_id ORDER BY written_at) AS revision,
--       (SELECT min(r.node_round) FROM rollouts r WHERE r.swarm_id = m.swarm_id
--          AND r.node_id = m.node_id AND r.published_at >= m.written_at) AS from_round
--     FROM read_json('<ledger>/_manifests/*/*/*.jsonl', format = 'newline_delimited',
--       columns = {swarm_id: 'VARCHAR', node_id: 'VARCHAR', experiment: 'VARCHAR',
--                  local_groups: 'INTEGER', external_groups: 'INTEGER', policy: 'VARCHAR',
--                  policy_params: 'VARCHAR', model_id: 'VARCHAR', prompt_format: 'VARCHAR',
--                  adapter: 'VARCHAR', seed: 'BIGINT', written_at: 'TIMESTAMPTZ', schema_version: 'INTEGER'}) m;
WITH per_round AS (
    SELECT swarm_id, node_id, node_round, avg(reward) AS claimed_reward
    FROM rollouts
    GROUP BY swarm_id, node_id, node_round
),
per_node AS (
    SELECT swarm_id, node_id, count(*) AS rounds, sum(claimed_reward) AS cumulative_claimed_reward,
           avg(claimed_reward) AS mean_claimed_reward
    FROM per_round
    GROUP BY swarm_id, node_id
),
zero AS (
    SELECT swarm_id, node_id, count(*) AS groups,
           avg(CASE WHEN reward_max = reward_min THEN 1 ELSE 0 END) AS zero_variance_fraction
    FROM groups
    GROUP BY swarm_id, node_id
),
configs AS (
    SELECT swarm_id, node_id,
           string_agg(local_groups || '/' || external_groups || ' ' || policy || ' from round '
                      || coalesce(CAST(from_round AS VARCHAR), '?'), '; ' ORDER BY revision)
               AS configurations
    FROM manifest_revisions
    GROUP BY swarm_id, node_id
),
drawn AS (
    SELECT swarm_id, node_id, count(*) AS groups_drawn, count(DISTINCT peer_node_id) AS peers
    FROM samples
    GROUP BY swarm_id, node_id
)
SELECT
    m.experiment,
    p.swarm_id,
    p.node_id,
    m.local_groups,
    m.external_groups,
    m.policy,
    m.model_id,
    m.prompt_format,
    m.adapter,
    m.revisions                  AS manifest_revisions,
    c.configurations,
    p.rounds,
    p.cumulative_claimed_reward,
    p.mean_claimed_reward,
    z.groups,
    z.zero_variance_fraction,
    coalesce(d.groups_drawn, 0)  AS groups_drawn,
    coalesce(d.peers, 0)         AS peers_drawn_from
FROM per_node p
LEFT JOIN manifests m ON m.swarm_id = p.swarm_id AND m.node_id = p.node_id
LEFT JOIN zero z ON z.swarm_id = p.swarm_id AND z.node_id = p.node_id
LEFT JOIN configs c ON c.swarm_id = p.swarm_id AND c.node_id = p.node_id
LEFT JOIN drawn d ON d.swarm_id = p.swarm_id AND d.node_id = p.node_id
ORDER BY p.swarm_id, p.node_id;
