"""Running on real services: scheduled deployments on a Prefect work pool (deploy.py) and
the stack of servers `sapo infra` starts (stack.py)."""
