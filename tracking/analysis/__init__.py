"""Analyses as projections over the stored records, read through tracking/store/ledger.py: seed 002's inconsistency
and error decomposition (`inconsistency`), Ensemble-of-Retrievers (`eor`: the definitions; `eor_cells`: fitted over
stored outcomes), metrics and confidence intervals, leaderboards and execution diffs (`history`), lineage and tables.
Above the store; below tracking/report (which shows them: the HTML report, the plots) and mlflow."""
