-- Reward-filtered sampling: keep groups whose mean claimed reward lies in
-- [$min_mean_reward, $max_mean_reward], published in the last $max_age_s seconds
-- before $now, optionally only groups whose rewards differ; then draw uniformly, fairly
-- across peers (fair_draw.sql: max_per_peer is a hard cap per peer).
-- Claimed rewards are the publisher's word: the receiver re-scores what it trains on, and
-- `drawable` computes them over the rows it would keep (claims on rows it drops count for
-- nothing).
--
-- Parameters: $node_id, $swarm_id, $excluded, $tasks as in paper.sql, and
--             $min_mean_reward, $max_mean_reward  bounds on the group's mean reward
--             $require_variance                  drop groups whose rewards all agree
--             $max_age_s, $now                   recency window (NULL: no window), by the
--                                                earlier of the publisher's stamp and the
--                                                reader's first sight
WITH candidates AS (
    SELECT group_id, node_id, content_digest, u AS draw
    FROM drawable
    WHERE node_id <> $node_id
      AND NOT list_contains($excluded::VARCHAR[], node_id)
      AND ($swarm_id IS NULL OR swarm_id = $swarm_id)
      AND ($tasks IS NULL OR list_contains($tasks::VARCHAR[], task))
      AND reward_mean BETWEEN $min_mean_reward AND $max_mean_reward
      AND (NOT $require_variance OR reward_max > reward_min)
      AND ($max_age_s IS NULL OR least(published_at, first_seen) >= $now - to_microseconds(CAST($max_age_s * 1e6 AS BIGINT)))
)
