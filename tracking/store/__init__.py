"""The event store: immutable record segments and run manifests (`events`), their packs (`catalog`, `compaction`),
call packs (`callpack`), and the one read path over them (`ledger`: views, queries, the question index). The lowest
part of tracking: analysis and mlflow read through it."""
