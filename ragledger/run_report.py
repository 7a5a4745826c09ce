"""What `ragledger run` prints: the header of a run, and its readers table and model calls (ragledger/cli.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from core.secrets import redact_url
from ragledger.cli_common import console

if TYPE_CHECKING:
    from schemas.spec import AnySpec


def print_run_header(spec: AnySpec) -> None:
    from schemas.spec import SweepSpec

    sweep = isinstance(spec, SweepSpec)
    datasets = ", ".join(f"{e.name + ': ' if sweep else ''}{e.dataset.name} (limit {e.dataset.limit})" for e in spec.expand())
    console.print(f"[bold]ragledger[/] {'sweep' if sweep else 'experiment'} [cyan]{spec.name}[/]: {len(spec.retrievers)} "
                  f"retriever(s) × {len(spec.readers)} reader(s) on {datasets}, model {spec.model.display_name}")


def print_summary(summary: dict) -> None:
    """A run's readers table and model calls; for a sweep (summary["experiments"]), one table per dataset."""
    from tracking.analysis.readers_table import readers_table
    from tracking.report.readers_table import display_rows, headers

    experiments = summary.get("experiments", [summary])
    for s in experiments:
        table = Table(title=f"{s['experiment']} — {s['questions']} questions", show_lines=False)
        for i, title in enumerate(headers()):
            table.add_column(title, no_wrap=True, justify="left" if i < 2 else "right", min_width=len(title) if i >= 2 else None)
        for row in display_rows(readers_table(s["cells"])):
            table.add_row(*row)
        console.print(table)
        if s.get("closed_book_dropped") is not None:
            console.print(f"closed-book filter (seed 001): dropped {s['closed_book_dropped']} of "
                          f"{s['questions_sampled']} sampled questions answered correctly without context; "
                          f"{s['questions']} remain")
        if "experiments" in summary:
            console.print(f"{s['experiment']}: model calls {s['llm_calls']}, {s['wall_time_s']:.1f} s, "
                          f"MLflow parent run {s['mlflow_parent_run_id']}")
    console.print("EM 95% CI: bootstrap over questions (1,000 resamples, seed 0); the same table is on the MLflow parent run "
                  "as analysis/readers_table.{csv,md,html}")
    what = f"this sweep ({len(experiments)} experiments)" if "experiments" in summary else "this run"
    tasks = ("no task ran" if summary.get("answered_from") else
             f"{summary['tasks_from_cache']}/{summary['tasks_total']} tasks from the cache")
    console.print(
        f"model calls {what}: [bold]{summary['llm_calls']}[/] (LLM-cache hits {summary['cache_hits']}, "
        f"retries {summary['retries']}; {tasks}) in {summary['wall_time_s']:.1f} s"
    )
    if summary.get("prompt_tokens_evaluated") is not None and summary.get("prompt_tokens_sent"):
        sent, evaluated = summary["prompt_tokens_sent"], summary["prompt_tokens_evaluated"]
        console.print(f"prompt tokens: {sent:,} sent, {evaluated:,} evaluated by the embedded server "
                      f"({100 * evaluated / sent:.0f}%: it reuses the previous prompt's prefix)")
    if summary.get("answered_from"):
        console.print(f"answered from the store: every cell's outcome is there (run manifest {summary['answered_from']}); "
                      "no flow run, model endpoint or index was started")
        if summary.get("recorder_pid"):  # flows/launch.py: a recorder logs earlier executions still pending
            console.print(f"MLflow: {redact_url(summary['tracking_uri'])}  the store's executions still pending are "
                          f"logged by a recorder (process {summary['recorder_pid']})")
    elif summary.get("recorder_pid"):  # flows/direct.py: Prefect and MLflow record the run after this table
        console.print(f"MLflow: {summary['tracking_uri']}  logged by the run's recorder (process "
                      f"{summary['recorder_pid']}) seconds after the last run ends (if it is stopped: ragledger sync)")
    elif any(s.get("mlflow_parent_run_id") is None for s in experiments):
        return  # MLflow did not take the logging: the error line after the table says so
    else:
        parents = ", ".join(s["mlflow_parent_run_id"] for s in experiments)
        console.print(f"MLflow: {summary['tracking_uri']}  experiment id {summary['mlflow_experiment_id']}, "
                      f"parent run{'s' if len(experiments) > 1 else ''} {parents}")
    uri = str(summary.get("tracking_uri") or "")
    if uri.startswith(("http://", "https://")):  # a tracking server serves its own UI
        console.print(f"open it at: {redact_url(uri)}")
    else:
        console.print("open it with: [bold]ragledger ui[/]   (then http://127.0.0.1:5000)")
