from __future__ import annotations

from datetime import date

from ledger.compaction import FileRef, plan_compaction

P1 = "swarm_id=sw/node_id=a/day=2026-03-01"
P2 = "swarm_id=sw/node_id=a/day=2026-03-02"
PB = "swarm_id=sw/node_id=b/day=2026-03-01"


def refs(partition, n, rows=10, start=0):
    return [FileRef(f"{partition}/r{i:08d}-x.parquet", rows) for i in range(start, start + n)]


def test_only_older_partitions_of_the_named_nodes_with_enough_files():
    files = (
        refs(P1, 3) + refs(P2, 3) + refs(PB, 3) + refs("swarm_id=sw/node_id=c/day=2026-03-01", 1)
    )
    jobs = plan_compaction(files, nodes={("sw", "a")}, before=date(2026, 3, 2))
    assert [(j.partition, len(j.inputs)) for j in jobs] == [(P1, 3)]
    everyone = plan_compaction(files, nodes=None, before=date(2026, 3, 2))
    assert [j.partition for j in everyone] == [P1, PB]  # c has a single file: nothing to do
    assert len(plan_compaction(files, nodes=None, before=None)) == 3


def test_inputs_are_cut_at_the_target_size_and_big_files_stay():
    files = [*refs(P1, 7, rows=40), FileRef(f"{P1}/c-big.parquet", 1000)]
    jobs = plan_compaction(files, nodes=None, before=None, target_rows=100)
    assert [len(j.inputs) for j in jobs] == [2, 2, 2]  # at most 100 rows; the 7th file waits
    assert all(f"{P1}/c-big.parquet" not in j.inputs for j in jobs)
    assert jobs[0].output != jobs[1].output
    assert jobs[0].output.startswith(P1 + "/c-")


def test_misplaced_keys_are_never_compacted():
    files = [FileRef("stray/a.parquet", 1), FileRef("stray/b.parquet", 1)]
    assert plan_compaction(files, nodes=None, before=None) == []


def test_inputs_are_cut_at_the_uncompressed_bound():
    files = [FileRef(f"{P1}/r{i:08d}-x.parquet", 10, unpacked=400) for i in range(5)]
    jobs = plan_compaction(files, nodes=None, before=None, target_bytes=1000)
    assert [len(j.inputs) for j in jobs] == [2, 2]  # 800 bytes each; the 5th file waits
