"""Orchestration: the `sapo` command line, and (later) Prefect flows and MLflow tracking."""
