"""The flows layer, above the stages: `ragledger run`'s one entry (launch: inputs checked, cached answer or head start
and flow), the experiment flow (execute: prepare, execute, record; its executor,
recording, run summary and task runners), a run's head start before Prefect is up (head_start, with the flow's own
plan and stage functions), the sweep and scheduled flows, the analysis flow, the plan they run (pure), and the only
use of Prefect's internals (prefect_internals)."""
