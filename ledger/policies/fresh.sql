-- Fresh sampling (not in the paper): peers' informative groups this receiver has never
-- drawn before, each peer's newest first, peers taking turns; when fewer qualify than asked
-- for, fewer come back (J adapts to what peers give).
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
-- What the receiver drew before (by id, by content, and by completion: `drawable` leaves
-- out every completion its log says it drew, from anyone, however many other rows a group
-- wraps it in) comes from its own sample log (the `samples` table, ledger/node_logs.py),
-- rounds before $node_round only: a retried round draws again what its first attempt drew
-- (and logged). With signatures on, nobody else can write that log; with them off, a peer
-- who writes a log in the receiver's name can hide groups from it (the receiver still
-- gets J from others, or fewer). Newest by the earlier of the publisher's stamp and this
-- reader's first sight, so a peer cannot jump the queue with a stamp from the future;
-- ties in a random order keyed by the receiver's secret (`drawable`'s `u`). Newest within
-- each peer only: across peers the draw takes turns (below), so neither newness nor a
-- stamp buys a peer a larger share of J than the caps of fair_draw.sql allow.
--
-- Parameters: $node_id, $swarm_id, $excluded, $tasks as in paper.sql, and
--             $node_round    the receiver's round this draw is for (NULL: every draw counts)
--             $max_age_s, $now   recency window (NULL: no window), by the
--                 earlier of the publisher's stamp and this reader's first sight
WITH drawn_before AS (
    -- The ids drawn, and what they said as the receiver's log recorded it from the rows it
    -- got (not what the index serves under that id now: a peer may reuse a drawn id for
    -- another's content): a copy of a group drawn before, under other ids, is not fresh.
    SELECT group_id, content_digest FROM samples
    WHERE node_id = $node_id AND ($swarm_id IS NULL OR swarm_id = $swarm_id)
      AND ($node_round IS NULL OR node_round < $node_round)
),
unseen AS (
    SELECT group_id, node_id, content_digest, least(published_at, first_seen) AS seen_at, u
    FROM drawable ANTI JOIN drawn_before USING (group_id)
        ANTI JOIN (SELECT content_digest FROM drawn_before WHERE content_digest IS NOT NULL)
            USING (content_digest)
    WHERE node_id <> $node_id
      AND NOT list_contains($excluded::VARCHAR[], node_id)
      AND ($swarm_id IS NULL OR swarm_id = $swarm_id)
      AND ($tasks IS NULL OR list_contains($tasks::VARCHAR[], task))
      AND reward_max > reward_min
      AND ($max_age_s IS NULL OR least(published_at, first_seen) >= $now - to_microseconds(CAST($max_age_s * 1e6 AS BIGINT)))
),
candidates AS (
    -- Peers take turns: every peer's newest group, then every peer's second newest, and so
    -- on. Newness picks which of a peer's groups come first, never which peer: a peer
    -- stamping its groups last gets no more of J than one that published a second earlier.
    -- The peers' order in each turn is keyed by the receiver's secret over what each
    -- offers (the `u` of its newest group, keyed by its content), never over its name: a
    -- node id ground offline buys nothing, exactly. The price: a quiet peer's oldest unseen
    -- group takes its turn before another peer's second newest (max_age_s keeps stale ones
    -- out).
    SELECT group_id, node_id, content_digest,
           {'turn': row_number() OVER newest,
            'peer': first_value(u) OVER newest} AS draw
    FROM unseen
    WINDOW newest AS (PARTITION BY node_id ORDER BY seen_at DESC, u)
)
