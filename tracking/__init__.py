"""The tracking layer, above schemas and below the stages: the event store (`tracking.store`), the analyses over it
(`tracking.analysis`), and MLflow (`tracking.mlflow`), in that order: each part imports only the parts before it."""
