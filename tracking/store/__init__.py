"""The event store: immutable record segments and run manifests (`events`) and call packs (`callpack`).
The lowest part of tracking: analysis and mlflow read it."""
