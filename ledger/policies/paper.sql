-- The paper's external sampler (SAPO, arXiv 2509.08721): drop groups whose rewards all
-- agree (every advantage would be zero, so the group teaches nothing), then sample
-- uniformly among the rest. Never returns the receiver's own groups. One addition: a peer
-- supplies at most $peer_share_cap groups (by default half of those asked for) while other
-- peers still have candidates, so that a peer publishing many groups cannot take a
-- receiver's whole J; caps of $n_groups are the paper's draw exactly.
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
--             $excluded peers the receiver no longer samples (its reputation of them)
--             $known    peers the receiver has verified enough of (NULL: every peer known)
--             $unknown_cap  soft cap on groups from peers not in $known, all of them together
--             $max_per_peer   hard cap per publishing node (max_per_peer, else $n_groups)
--             $peer_share_cap soft cap: a peer's groups beyond it come after every other
--                             peer's (from max_peer_share)
WITH candidates AS (
    SELECT group_id, node_id, hash(concat_ws('/', group_id, $node_id, $seed)) AS draw
    FROM groups
    WHERE node_id <> $node_id
      AND NOT list_contains($excluded::VARCHAR[], node_id)
      AND ($swarm_id IS NULL OR swarm_id = $swarm_id)
      AND reward_max > reward_min
),
per_peer AS (
    -- Each peer's lowest draws, in order, as many as the hard cap allows (see
    -- reward_filtered.sql).
    SELECT node_id, min_by({'group_id': group_id, 'draw': draw}, draw, $max_per_peer) AS picks
    FROM candidates
    GROUP BY node_id
),
ranked AS (
    SELECT node_id, unnest(picks) AS pick, generate_subscripts(picks, 1) AS peer_rank
    FROM per_peer
),
budgeted AS (
    -- Groups of peers not yet known (see $known) beyond $unknown_cap, counted across all
    -- of them in draw order, come after everything else: many new ids cannot take J.
    SELECT *, CASE WHEN NOT list_contains($known::VARCHAR[], node_id) THEN row_number() OVER (
        PARTITION BY list_contains($known::VARCHAR[], node_id) ORDER BY pick.draw ) END
        AS unknown_rank
    FROM ranked
)
SELECT pick.group_id
FROM budgeted
ORDER BY peer_rank > $peer_share_cap OR coalesce(unknown_rank > $unknown_cap, false),
    pick.draw
LIMIT $n_groups
