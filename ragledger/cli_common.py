"""What every `ragledger` command module shares: the two consoles, the one-line error exit, the checks of a file or
folder to write, the user-error classes and the stage progress bars. Every ragledger/cli*.py module imports it; it
imports none of them."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from core.progress import Stages, StageState

DEFAULT_STORE = ".ragledger/store"  # the spec's tracking.store default, for commands that take --store alone
# indexes are keyed by corpus hash and shared by every store and checkout (tasks/context.py index_root_for)
CORPUS_HELP = ("the corpus instead of the spec's: squad-paragraphs (SQuAD's own paragraphs), or KIND:PATH with KIND a "
               "corpus kind: jsonl, dpr-tsv, lucene (a file or index folder) or another registered one, or "
               "prebuilt:NAME (a Pyserini prebuilt index); docs/spec.md")
INDEXES_HELP = ("indexes are not kept beside it: they go to $RAGLEDGER_INDEX_DIR (default: indexes/ under $RAGLEDGER_HOME, "
                "~/.cache/ragledger)")

if TYPE_CHECKING:
    from rich.progress import Progress

# wide enough for the results table when output goes to a file or CI log
console = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, soft_wrap=True)  # an error stays one line, whatever the terminal width


def fail(message: str, code: int = 2) -> NoReturn:
    """End the command with one `error:` line. The message is text, not Rich markup: a path or a cell name with
    brackets is shown as it is."""
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code)


def checked_store(store: str, creating: bool = False, writing: bool = False) -> str:
    """`--store` must be a ragledger store, or, for a command that makes one (`creating`), a new or empty folder:
    asked before the command reads or writes anything, one error line naming the folder otherwise (and, for an
    s3:// store and a command that writes, `writing`, naming credentials that may only read). The folder the
    command then works on: `store` itself, or an s3:// store's local mirror (tracking/store/remote.py)."""
    from tracking.store.identity import NotAStoreError, require_store
    from tracking.store.objects import StorageError
    from tracking.store.remote import local_root

    try:
        root = local_root(store, "--store", creating, writing)
        require_store(root, "--store", creating)
    except (NotAStoreError, StorageError) as exc:
        fail(str(exc))
    return root


def output_file(param: typer.CallbackParam, value: Path | None) -> Path | None:
    """Typer callback for an option naming a file the command writes (`--output`): checked while the options are
    parsed, so before the command reads or computes anything (ragledger/locations.py), one error line naming the
    option and the path otherwise. Its folder must exist: a mistyped folder is not made to hide the output in."""
    if value is not None:
        path = Path(os.path.abspath(value.expanduser()))
        if not path.parent.exists():
            fail(f"{param.opts[0]}: cannot create {path}: folder {path.parent} does not exist")
        _check(param.opts[0], path, "file")
    return value


def output_folder(param: typer.CallbackParam, value: Path | None) -> Path | None:
    """Typer callback for an option naming a folder the command writes files into (`analyze --out`): a writable
    folder, or one that can be made there (the command makes it), checked like `output_file`."""
    if value is not None:
        _check(param.opts[0], value, "dir")
    return value


def _check(option: str, path: Path, kind: Literal["dir", "file"]) -> None:
    from ragledger.locations import Location, LocationError, check_location

    try:
        check_location(Location(option, path, kind))
    except LocationError as exc:
        fail(str(exc))


def user_errors() -> tuple[type[BaseException], ...]:
    """The errors the user or the machine must fix: their message names the culprit (exit 2, no traceback)."""
    from core.datasets import DatasetError
    from core.diskfull import StoreFullError
    from core.secrets import CredentialsInURL
    from engines.embedded import EmbeddedServerError
    from engines.llm import BackendError
    from engines.models import ModelFetchError
    from ragledger.locations import LocationError
    from schemas.errors import RecordValidationError
    from schemas.spec import SpecError
    from tracking.mlflow.log import MlflowCredentialsError
    from tracking.mlflow.sync import MlflowLoggingPending
    from tracking.store.identity import NotAStoreError
    from tracking.store.objects import StorageError

    return (SpecError, DatasetError, BackendError, EmbeddedServerError, ModelFetchError, RecordValidationError,
            LocationError, CredentialsInURL, StoreFullError, MlflowLoggingPending, NotAStoreError,
            MlflowCredentialsError, StorageError)


def usage_error(message: str) -> BaseException:
    from schemas.spec import SpecError

    return SpecError(message)


@contextlib.contextmanager
def stage_progress() -> Iterator[None]:
    """Rich progress bars fed by core.progress (one bar per stage, created on its first report, with its time left);
    plain progress lines every 30 s when the output is not a terminal (a long run logged to a file)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from core import progress as prog

    if not console.is_terminal:
        prog.set_listener(prog.PlainProgress(lambda line: console.print(line, highlight=False, markup=False)))
        try:
            yield
        finally:
            prog.set_listener(None)
        return
    with Progress(TextColumn("{task.description:>16}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[left]}"), console=console) as bars:
        prog.set_listener(_Bars(bars))
        try:
            yield
        finally:
            prog.set_listener(None)


class _Bars(Stages):
    """One rich bar per stage of core.progress, each with the stage's time left."""

    def __init__(self, bars: Progress) -> None:
        super().__init__()
        self.bars, self.ids = bars, {}

    def total(self, stage: str, n: int, timed: bool = True, begun: bool = True) -> StageState:
        state = super().total(stage, n, timed, begun)
        if stage in self.ids:  # a stage's total is set once per experiment: each of a sweep restarts it
            self.bars.reset(self.ids[stage], total=n, left="")
        return self._show(stage, state)

    def revise(self, stage: str, n: int, work: float | None = None) -> StageState:
        return self._show(stage, super().revise(stage, n, work))

    def advance(self, stage: str, n: int, work: float | None = None) -> StageState:
        return self._show(stage, super().advance(stage, n, work))

    def _show(self, stage: str, state: StageState) -> StageState:
        if stage not in self.ids:
            self.ids[stage] = self.bars.add_task(stage, total=state.total, left="")
        left = state.left(self.clock())
        self.bars.update(self.ids[stage], total=state.total, completed=state.done,
                         left="" if left is None else f"~{left:.0f} s left")
        return state
