"""The sharing sweep: its file (sweep.py) and the Prefect flow that runs it (flow.py)."""
