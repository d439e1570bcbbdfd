-- The paper's external sampler (SAPO, arXiv 2509.08721): drop groups whose rewards all
-- agree (every advantage would be zero, so the group teaches nothing), then sample
-- uniformly among the rest. Never returns the receiver's own groups. One addition: at most
-- $max_per_peer groups from any one peer (by default half of those asked for), so that a
-- peer publishing many groups cannot take a receiver's whole J; a cap of $n_groups is the
-- paper's draw exactly.
--
-- Parameters: $node_id  receiving node
--             $swarm_id restrict to one swarm (NULL: any)
--             $seed     replayable draw: ordering by a hash of the text
--                       "group/receiver/seed" is a uniform random permutation of the
--                       candidates, independent between receivers that share a seed.
--                       (DuckDB's multi-argument hash(a, b, c) combines its inputs too
--                       weakly for this: over seeds it reached 8 of 20 possible 3-of-6
--                       draws.)
--             $n_groups how many groups to return
--             $max_per_peer cap per publishing node (the sampler's, from max_per_peer
--                       and max_peer_share)
WITH candidates AS (
    SELECT group_id, node_id, hash(concat_ws('/', group_id, $node_id, $seed)) AS draw
    FROM groups
    WHERE node_id <> $node_id
      AND ($swarm_id IS NULL OR swarm_id = $swarm_id)
      AND reward_max > reward_min
),
capped AS (
    -- Each peer's lowest draws, as many as the cap allows (see reward_filtered.sql).
    SELECT unnest(min_by({'group_id': group_id, 'draw': draw}, draw, $max_per_peer)) AS pick
    FROM candidates
    GROUP BY node_id
)
SELECT pick.group_id
FROM capped
ORDER BY pick.draw
LIMIT $n_groups
