-- The paper's external sampler (SAPO, arXiv 2509.08721): drop groups whose rewards all
-- agree (every advantage would be zero, so the group teaches nothing), then sample
-- uniformly among the rest. Never returns the receiver's own groups. One addition, in
-- fair_draw.sql (which the sampler appends to every policy): a peer supplies at most half
-- the groups asked for while other peers still have candidates, and new peers a quarter,
-- so that no peer and no crowd of new ids takes a receiver's whole J (max_peer_share and
-- max_unknown_share at 1.0: the paper's draw exactly).
--
-- Groups come from `drawable` (drawable.sql): each as the receiver would train on it (its
-- own completions, repeats and rows beyond its group size left out, the claims over what
-- is left), in a uniform random order `u` keyed by the receiver's secret draw key: no
-- publisher can compute where its groups fall, so none can grind ids to come first.
--
-- Parameters: $node_id  receiving node
--             $swarm_id restrict to one swarm (NULL: any)
--             $excluded peers the receiver no longer samples (its reputation of them)
--             $tasks    tasks the receiver's verifier judges (NULL: any): a group it
--                       cannot judge would take a slot of J and teach it nothing
WITH candidates AS (
    SELECT group_id, node_id, content_digest, u AS draw
    FROM drawable
    WHERE node_id <> $node_id
      AND NOT list_contains($excluded::VARCHAR[], node_id)
      AND ($swarm_id IS NULL OR swarm_id = $swarm_id)
      AND ($tasks IS NULL OR list_contains($tasks::VARCHAR[], task))
      AND reward_max > reward_min
)
