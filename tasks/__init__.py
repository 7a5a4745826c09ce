"""The stages layer, above tracking and below flows: one module per stage (retrieve, generate rounds, vote,
evaluate, and seed 001's closed-book filter), each a function of small inputs that writes its records and returns
where they went; `tasks.stages` defines the stages and their keys, `tasks.prefect_tasks` wraps them as Prefect tasks
(imported only where Prefect runs them)."""
