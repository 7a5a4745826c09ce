"""Analyses as projections over the stored records: seed 002's inconsistency and error decomposition
(`inconsistency`), Ensemble-of-Retrievers (`eor`: the definitions; `eor_cells`: fitted over stored outcomes), an
experiment's executions and outcomes (`executions`), metrics and confidence intervals, per-example queries (`query`,
over the views of `overlaps`), lineage, tables, plots and reports. Above the store, below mlflow."""
