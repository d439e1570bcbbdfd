-- The fair draw every policy ends with: the policy's own SQL (paper.sql, ...) defines
-- `candidates` (group_id, node_id, draw: lower draws first); this takes the lowest draws
-- with two caps and a budget, so that no peer, and no crowd of new peers, takes a
-- receiver's whole J. The sampler appends it to the policy's SQL (Policy.sql).
--
-- Parameters: $n_groups       how many groups to return
--             $max_per_peer   hard cap per publishing node (max_per_peer, else $n_groups)
--             $peer_share_cap soft cap: a peer's groups beyond it come after every other
--                             peer's (max_peer_share)
--             $known          peers the receiver has verified enough of (NULL: all known)
--             $unknown_cap    soft cap on the groups of peers not in $known, all together
--                             (max_unknown_share)
--             $pool           draw among the $pool lowest draws only (NULL: all)
--
-- Besides each group id it returns whether a cap put it late and whether its peer is
-- unknown: with those, the sampler can tell when an answer drawn from a small pool is the
-- answer over all candidates (Ledger._draw), and skip the per-peer pass over all of them.
pool AS (
    SELECT * FROM candidates ORDER BY draw LIMIT $pool
),
per_peer AS (
    -- Each peer's lowest draws, in order, as many as the hard cap allows: a top-k per
    -- peer without sorting them all. No answer takes more than $n_groups from one peer,
    -- so that bounds k as well.
    SELECT node_id, min_by({'group_id': group_id, 'draw': draw}, draw, $max_per_peer) AS picks
    FROM pool
    GROUP BY node_id
),
ranked AS (
    SELECT node_id, unnest(picks) AS pick, generate_subscripts(picks, 1) AS peer_rank
    FROM per_peer
),
budgeted AS (
    -- Groups of peers not yet known beyond $unknown_cap, counted across all of them in
    -- draw order, come after everything else: many new ids cannot take J.
    -- Ranked by each peer's own order first, so that one flooding newcomer cannot spend
    -- the whole budget before other newcomers get their first group.
    SELECT *, CASE WHEN NOT list_contains($known::VARCHAR[], node_id) THEN row_number() OVER (
        PARTITION BY list_contains($known::VARCHAR[], node_id) ORDER BY peer_rank, pick.draw)
        END AS unknown_rank
    FROM ranked
)
SELECT pick.group_id,
    peer_rank > $peer_share_cap OR coalesce(unknown_rank > $unknown_cap, false) AS late,
    coalesce(NOT list_contains($known::VARCHAR[], node_id), false) AS unknown
FROM budgeted
ORDER BY late, pick.draw
LIMIT $n_groups
