-- Reward-filtered sampling: keep groups whose mean claimed reward lies in
-- [$min_mean_reward, $max_mean_reward], published in the last $max_age_s seconds
-- before $now, optionally only groups whose rewards differ, and at most
-- $max_per_peer groups from any one peer; then draw uniformly.
-- Claimed rewards are the publisher's word: the receiver re-scores what it trains on.
--
-- Parameters: $node_id, $swarm_id, $seed, $n_groups as in paper.sql, and
--             $min_mean_reward, $max_mean_reward  bounds on the group's mean reward
--             $require_variance                  drop groups whose rewards all agree
--             $max_age_s, $now                   recency window (NULL: no window), by the earlier
--                                                of the publisher's stamp and the reader's first sight
--             $max_per_peer                      hard cap per publishing node
--             $peer_share_cap                    soft cap: a peer's groups beyond it come
--                                                after every other peer's (max_peer_share)
WITH candidates AS (
    SELECT group_id, node_id, hash(concat_ws('/', group_id, $node_id, $seed)) AS draw
    FROM groups
    WHERE node_id <> $node_id
      AND NOT list_contains($excluded::VARCHAR[], node_id)
      AND ($swarm_id IS NULL OR swarm_id = $swarm_id)
      AND reward_mean BETWEEN $min_mean_reward AND $max_mean_reward
      AND (NOT $require_variance OR reward_max > reward_min)
      AND ($max_age_s IS NULL OR least(published_at, first_seen) >= $now - to_microseconds(CAST($max_age_s * 1e6 AS BIGINT)))
),
per_peer AS (
    -- Each peer's lowest draws, in order, as many as the hard cap allows: a top-k per
    -- peer without sorting them all. No answer takes more than $n_groups from one peer,
    -- so that bounds k as well.
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
