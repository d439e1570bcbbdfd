"""Statistics over many runs of an experiment: each finished run's record (a few kilobytes
that outlive its ledger), the paired-seed gains with their intervals, the replicate tables
and their report, the comparison with the paper's table, the mixed-families diagnostics.

Above ``dashboards`` (whose SQL reads the ledger a record is made from) and ``ledger``;
no algorithm, orchestration or tracking: a person with committed records needs neither.
"""
