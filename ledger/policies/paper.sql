-- The paper's external sampler (SAPO, arXiv 2509.08721): drop groups whose rewards all
-- agree (every advantage would be zero, so the group teaches nothing), then sample
-- uniformly among the rest. Never returns the receiver's own groups.
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
SELECT group_id
FROM groups
WHERE node_id <> $node_id
  AND ($swarm_id IS NULL OR swarm_id = $swarm_id)
  AND reward_max > reward_min
ORDER BY hash(concat_ws('/', group_id, $node_id, $seed))
LIMIT $n_groups
