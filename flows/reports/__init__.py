"""Reading results: the report of a ledger (report.py) and `sapo compare` over MLflow
(compare.py)."""
