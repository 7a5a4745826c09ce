"""MLflow as the team's shared record, the top part of tracking: the client and its settings (`log`), one execution
logged as a parent run with a run per cell (`runs`) and what those runs show (`views`: provenance, dataset input,
outcomes table, call pack; `traces`: question traces), logged exactly once whenever MLflow takes it (`sync`), pulled
back into a store (`pull`), an analysis on its execution's parent run (`analysis`), and the MLflow internals these
use (`internals`)."""
