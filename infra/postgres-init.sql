-- Prefect uses the database POSTGRES_DB creates; MLflow gets its own.
CREATE DATABASE mlflow;
