-- The paper's external sampler (SAPO, arXiv 2509.08721): drop groups whose rewards all
-- agree (every advantage would be zero, so the group teaches nothing), then sample
-- uniformly among the rest. Never returns the receiver's own groups. One addition, in
-- fair_draw.sql (which the sampler appends to every policy): a peer supplies at most half
-- the groups asked for while other peers still have candidates, and new peers a quarter,
-- so that no peer and no crowd of new ids takes a receiver's whole J (max_peer_share and
-- max_unknown_share at 1.0: the paper's draw exactly).
--
-- Parameters: $node_id  receiving node
--             $swarm_id restrict to one swarm (NULL: any)
--             $seed     replayable draw: the group's hash, xor'ed with a hash of
--                       "receiver/seed", hashed again (DuckDB's integer hash is a
--                       bijective mixer): a uniform random permutation of the candidates,
--                       independent between receivers that share a seed, without
--                       building a text per group. (DuckDB's multi-argument hash(a, b, c)
--                       combines its inputs too weakly for this: over seeds it reached 8
--                       of 20 possible 3-of-6 draws.)
--             $excluded peers the receiver no longer samples (its reputation of them)
--             $tasks    tasks the receiver's verifier judges (NULL: any): a group it
--                       cannot judge would take a slot of J and teach it nothing
WITH candidates AS (
    SELECT group_id, node_id, content_digest, hash(xor(hash(group_id), hash(concat_ws('/', $node_id, $seed)))) AS draw
    FROM groups
    WHERE node_id <> $node_id
      AND NOT list_contains($excluded::VARCHAR[], node_id)
      AND ($swarm_id IS NULL OR swarm_id = $swarm_id)
      AND ($tasks IS NULL OR list_contains($tasks::VARCHAR[], task))
      AND reward_max > reward_min
)
