"""Orchestration: the `sapo` command line, the swarm config, Prefect flows of a node's
rounds, the local swarm launcher, deployments, sweeps and MLflow tracking."""
