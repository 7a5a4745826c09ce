-- a second database for the Prefect server (the first, mlflow, is POSTGRES_DB)
CREATE DATABASE prefect;
