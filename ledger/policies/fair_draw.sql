-- The fair draw every policy ends with: the policy's own SQL (paper.sql, ...) defines
-- `candidates` (group_id, node_id, content_digest, draw: lower draws first); this takes
-- the lowest draws, each content once, with two caps and a budget, so that no peer, and no
-- crowd of new peers, takes a receiver's whole J. The sampler appends it to the policy's
-- SQL (Policy.sql).
--
-- Parameters: $node_id        the receiver, as in the policy's SQL
--             $n_groups       how many groups to return
--             $max_per_peer   hard cap per publishing node (max_per_peer, else $n_groups)
--             $peer_share_cap soft cap: a peer's groups beyond it come after every other
--                             peer's (max_peer_share)
--             $known          peers the receiver has verified enough of (NULL: all known)
--             $unknown_cap    soft cap on the groups of peers not in $known, all together
--                             (max_unknown_share)
--             $standing, $standing_rows  peers not in $known judged well so far, and
--                             the rows judged of each (NULL: none): first in that budget
--             $pool           draw among the $pool lowest draws only (NULL: all)
--             $cut            'node_id/content_digest' of copies a hard cap cut (below;
--                             NULL: none yet)
--
-- Besides each group id it returns whether a cap put it late and whether its peer is
-- unknown: with those, the sampler can tell when an answer drawn from a small pool is the
-- answer over all candidates (Ledger._draw), and skip the per-peer pass over all of them.
-- And, on every row, the copies the hard cap cut this time (NULL: none): the sampler
-- draws again without them, until none is cut, so that a content goes to the lowest
-- draw among the peers with room for it.
uncopied AS (
    -- Copies (groups of one content, validation.GROUP_CONTENT_SQL, under other ids): a
    -- peer may republish the receiver's own groups, or another peer's, as its own. They
    -- verify, so they would fill J with texts the receiver trained on when it made them,
    -- or take a second slot for one group, and earn a copier a record without generating.
    -- Never the receiver's own content (`drawable` has already left out every completion
    -- of its own, however wrapped); of a content several peers published, the copy
    -- with the lowest draw only (below): which copy is the original no reader can tell,
    -- since publishers stamp their own times.
    -- Copies of one content share their key (drawable's `u`): ties go by the keyed order
    -- of their publishers (`tie`), never by a name a copier could choose to sort first.
    SELECT c.*, d.peer_u AS tie FROM candidates c JOIN drawable d USING (group_id)
    WHERE c.content_digest NOT IN (SELECT content_digest FROM groups WHERE node_id = $node_id)
      AND ($cut IS NULL
        OR concat(c.node_id, '/', c.content_digest) NOT IN (SELECT unnest($cut::VARCHAR[])))
),
pool AS (
    SELECT * FROM uncopied ORDER BY draw, tie, group_id LIMIT $pool
),
first_copies AS (
    -- Every copy of a content within the pool has its lowest draw there too (the pool is
    -- the lowest draws), so the pool's answer is still the answer over all candidates.
    SELECT DISTINCT ON (content_digest) * FROM pool ORDER BY content_digest, draw, tie, group_id
),
per_peer AS (
    -- Each peer's lowest draws, in order, as many as the hard cap allows: a top-k per
    -- peer without sorting them all. No answer takes more than $n_groups from one peer,
    -- so that bounds k as well.
    SELECT node_id, min_by({'group_id': group_id, 'draw': draw}, draw, $max_per_peer) AS picks
    FROM first_copies
    GROUP BY node_id
),
cut AS (
    -- A peer's first copy of a content that its hard cap cuts (it has $max_per_peer lower
    -- draws) would take the content from every other copy, and so from a peer with room:
    -- a copier holding more contents than its cap would shorten the draw. Cut, it can
    -- never be drawn, whatever else is, so the sampler drops it (and its peer's other
    -- copies of that content) and draws again: the same answer as taking groups one by
    -- one in draw order, each whose content is new and whose peer has room.
    SELECT DISTINCT concat(f.node_id, '/', f.content_digest) AS copy
    FROM first_copies f JOIN per_peer USING (node_id)
    SEMI JOIN pool other
        ON other.content_digest = f.content_digest AND other.node_id <> f.node_id
    WHERE len(picks) = $max_per_peer AND f.draw > picks[-1].draw
),
ranked AS (
    SELECT node_id, unnest(picks) AS pick, generate_subscripts(picks, 1) AS peer_rank
    FROM per_peer
),
budgeted AS (
    -- Groups of peers not yet known beyond $unknown_cap, counted across all of them in
    -- draw order, come after everything else: many new ids cannot take J.
    -- Ranked by each peer's own order first, so that one flooding newcomer cannot spend
    -- the whole budget before other newcomers get their first group; then by standing
    -- (rows judged of a peer so far, all well: $standing_rows), so that a crowd of new ids
    -- cannot displace a peer the receiver is already coming to know: each newcomer is
    -- judged in turn, and many ids become known no faster than one.
    SELECT *, CASE WHEN NOT list_contains($known::VARCHAR[], node_id) THEN row_number() OVER (
        PARTITION BY list_contains($known::VARCHAR[], node_id)
        ORDER BY peer_rank,
            coalesce(($standing_rows::BIGINT[])[list_position($standing::VARCHAR[], node_id)], 0)
                DESC,
            pick.draw)
        END AS unknown_rank
    FROM ranked
)
SELECT pick.group_id,
    peer_rank > $peer_share_cap OR coalesce(unknown_rank > $unknown_cap, false) AS late,
    coalesce(NOT list_contains($known::VARCHAR[], node_id), false) AS unknown,
    (SELECT list(copy ORDER BY copy) FROM cut) AS cut
FROM budgeted
-- Unknown peers' groups beyond the budget after everything else, known peers' beyond
-- their share included: while known peers have candidates, new ids take no more.
ORDER BY coalesce(unknown_rank > $unknown_cap, false), late, pick.draw
LIMIT $n_groups
