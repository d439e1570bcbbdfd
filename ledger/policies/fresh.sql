-- Fresh sampling (not in the paper): peers' informative groups this receiver has never
-- drawn before, newest first; when fewer qualify than asked for, fewer come back (J adapts
-- to what peers give).
--
-- Why (from the aha-cpu diagnostics, docs/aha-cpu): every node generates and publishes
-- I + J groups a round, and without sharing 1.28 of a node's 4 groups a round were
-- informative. A receiver's two peers thus publish ~2.6 new informative groups a round;
-- at 1/3 it asks for 3. The paper's draw is uniform over every informative group ever
-- published, so at round r only about 1/r of what it draws is new: by round 8 most of a
-- node's external training set is texts written by peers' policies of many rounds ago,
-- and it trains on the same few of them again and again (36 draws over 12 rounds from a
-- pool of ~30). That is the paper's "nodes take more than they give": the pool degrades
-- and training oscillates at high J. Here a receiver trains on each peer group at most
-- once and on the most recent first (closest to the swarm's current policies), and takes
-- no more than the peers' fresh supply.
--
-- What the receiver drew before comes from its own sample log (the `samples` table,
-- ledger/node_logs.py), rounds before $node_round only: a retried round draws again what
-- its first attempt drew (and logged). With signatures on, nobody else can write that log;
-- with them off, a peer who writes a log in the receiver's name can hide groups from it
-- (the receiver still gets J from others, or fewer). Newest by the
-- earlier of the publisher's stamp and this reader's first sight, so a peer cannot jump
-- the queue with a stamp from the future; ties in a random order from the seed.
--
-- Parameters: $node_id, $swarm_id, $seed, $excluded as in paper.sql, and
--             $node_round    the receiver's round this draw is for (NULL: every draw counts)
--             $max_age_s, $now   recency window (NULL: no window), by the
--                 earlier of the publisher's stamp and this reader's first sight
WITH drawn_before AS (
    SELECT DISTINCT group_id FROM samples
    WHERE node_id = $node_id AND ($swarm_id IS NULL OR swarm_id = $swarm_id)
      AND ($node_round IS NULL OR node_round < $node_round)
),
candidates AS (
    SELECT group_id, node_id,
           {'age': -epoch_us(least(published_at, first_seen)),
            'shuffle': hash(xor(hash(group_id), hash(concat_ws('/', $node_id, $seed))))} AS draw
    FROM groups ANTI JOIN drawn_before USING (group_id)
    WHERE node_id <> $node_id
      AND NOT list_contains($excluded::VARCHAR[], node_id)
      AND ($swarm_id IS NULL OR swarm_id = $swarm_id)
      AND reward_max > reward_min
      AND ($max_age_s IS NULL OR least(published_at, first_seen) >= $now - to_microseconds(CAST($max_age_s * 1e6 AS BIGINT)))
)
