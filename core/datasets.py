"""Dataset and corpus loaders. Every loader yields questions with stable ids and a list of gold answers.

Formats (see ../shared/data/README.md): SQuAD JSON (gold paragraph known), NQ-open / TriviaQA JSONL
(`{"question", "answer": [...]}`), DPR topic files (TSV with python-list answers, or JSON lines),
WebQuestions (JSON list of `{"qId","qText","answers"}`), and user JSONL of `{id?, question, answers}`.
Problems are reported with file, row and field.
"""

from __future__ import annotations

import ast
import csv
import gzip
import hashlib
import io
import itertools
import json
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from core.paths import file_identity, resolve_data_path


class DatasetError(ValueError):
    """A dataset or corpus file is missing or malformed; the message names file, row and field."""


@dataclass
class Question:
    qid: str
    question: str
    answers: list[str]
    gold_pids: list[str] = field(default_factory=list)


def _open_text(path: Path, newline: str = "") -> io.TextIOBase:
    if not path.is_file():
        raise DatasetError(f"{path}: file not found")
    raw = gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")  # noqa: SIM115 (closed by the wrapper)
    return io.TextIOWrapper(raw, encoding="utf-8", errors="strict", newline=newline)


def _read_all(path: Path) -> str:
    with _open_text(path) as fh:
        try:
            return fh.read()
        except UnicodeDecodeError as exc:
            raise DatasetError(f"{path}: not valid UTF-8 (byte offset {exc.start})") from None


def _iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    text = _read_all(path)
    # split on \n only: str.splitlines() would also split inside answers holding U+2028 or U+0085
    for row, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            yield row, line


def _check(path: Path, row: int | str, q: str, answers: object, qid: str) -> Question:
    if not isinstance(q, str) or not q.strip():
        raise DatasetError(f"{path}: row {row}: field 'question' is empty or missing")
    if isinstance(answers, str):
        answers = [answers]
    if not isinstance(answers, list) or not answers:
        raise DatasetError(f"{path}: row {row}: field 'answers' has no answers")
    if not all(isinstance(a, str) for a in answers):
        raise DatasetError(f"{path}: row {row}: field 'answers' must be a list of strings")
    answers = [a for a in answers if a.strip()]
    if not answers:
        raise DatasetError(f"{path}: row {row}: field 'answers' has only empty strings")
    return Question(qid=qid, question=q.strip(), answers=answers)


@dataclass(frozen=True)
class DatasetFormat:
    """A question file format, registered under its spec name (`dataset.name`) by `dataset_format`."""

    load: Callable[[Path], list[Question]]  # the file's questions; DatasetError naming file, row and field
    description: str
    derived_ids: bool = False  # ids derived from the question text: a repeated question is kept, numbered by its row


DATASET_FORMATS: dict[str, DatasetFormat] = {}


def dataset_format(name: str, description: str, derived_ids: bool = False):
    """Register a loader `(path) -> list[Question]` as the dataset format `name`: the spec accepts it from then on."""

    def register(load: Callable[[Path], list[Question]]) -> Callable[[Path], list[Question]]:
        DATASET_FORMATS[name] = DatasetFormat(load, description, derived_ids)
        return load

    return register


def _fallback_id(prefix: str, question: str) -> str:
    return f"{prefix}-{hashlib.sha1(question.encode()).hexdigest()[:12]}"


@dataset_format("squad", "SQuAD JSON (the gold paragraph is known)")
def load_squad(path: Path) -> list[Question]:
    try:
        data = json.loads(_read_all(path))
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}: malformed JSON at line {exc.lineno}: {exc.msg}") from None
    if not isinstance(data, dict) or "data" not in data:
        raise DatasetError(f"{path}: field 'data' missing: not a SQuAD JSON file")
    out = []
    for a_idx, article in enumerate(data["data"]):
        title = article.get("title", f"article{a_idx}")
        for p_idx, para in enumerate(article.get("paragraphs", [])):
            pid = squad_pid(title, p_idx)
            for q_idx, qa in enumerate(para.get("qas", [])):
                where = f"data[{a_idx}].paragraphs[{p_idx}].qas[{q_idx}]"
                answers = [a.get("text", "") for a in qa.get("answers", []) if isinstance(a, dict)]
                q = _check(path, where, qa.get("question", ""), answers, str(qa.get("id") or f"{pid}_{q_idx}"))
                q.gold_pids = [pid]
                out.append(q)
    return out


def squad_pid(title: str, paragraph_index: int) -> str:
    return f"{title}_{paragraph_index}"


def load_answer_jsonl(path: Path, prefix: str) -> list[Question]:
    """NQ-open, TriviaQA, DPR JSON-lines topics and user JSONL ({id?, question, answers|answer})."""
    out = []
    for row, line in _iter_lines(path):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}: row {row}: malformed JSON: {exc.msg}") from None
        if not isinstance(obj, dict):
            raise DatasetError(f"{path}: row {row}: expected a JSON object")
        answers = obj.get("answers", obj.get("answer"))
        q = obj.get("question", "")
        qid = str(obj["id"]) if obj.get("id") is not None else _fallback_id(prefix, str(q))
        out.append(_check(path, row, q, answers, qid))
    return out


def load_dpr_tsv(path: Path, prefix: str) -> list[Question]:
    out = []
    text = _read_all(path)
    for row, rec in enumerate(csv.reader(io.StringIO(text), delimiter="\t"), start=1):
        if not rec:
            continue
        if len(rec) < 2:
            raise DatasetError(f"{path}: row {row}: field 'answers' missing (expected question<TAB>list)")
        try:
            answers = ast.literal_eval(rec[1])
        except (ValueError, SyntaxError):
            raise DatasetError(f"{path}: row {row}: field 'answers' is not a python list literal") from None
        out.append(_check(path, row, rec[0], answers, _fallback_id(prefix, rec[0])))
    return out


@dataset_format("webquestions", "WebQuestions: a JSON list of {qId, qText, answers}")
def load_webquestions(path: Path) -> list[Question]:
    try:
        data = json.loads(_read_all(path))
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}: malformed JSON at line {exc.lineno}: {exc.msg}") from None
    if not isinstance(data, list):
        raise DatasetError(f"{path}: expected a JSON list of questions")
    out = []
    for row, obj in enumerate(data, start=1):
        if not isinstance(obj, dict):
            raise DatasetError(f"{path}: row {row}: expected a JSON object")
        q = obj.get("qText", obj.get("question", ""))
        qid = str(obj.get("qId") or _fallback_id("wq", str(q)))
        out.append(_check(path, row, q, obj.get("answers"), qid))
    return out


dataset_format("nq-open", "NQ-open JSON lines {question, answer: [...]}", derived_ids=True)(
    lambda p: load_answer_jsonl(p, "nq"))
dataset_format("triviaqa", "TriviaQA JSON lines {question, answer: [...]}", derived_ids=True)(
    lambda p: load_answer_jsonl(p, "tqa"))
dataset_format("jsonl", "JSON lines of {id?, question, answers}")(lambda p: load_answer_jsonl(p, p.stem.split(".")[0]))


@dataset_format("dpr-topics", "DPR topic files: TSV question<TAB>python list of answers, or JSON lines", derived_ids=True)
def load_dpr_topics(p: Path) -> list[Question]:
    if ".txt" in p.name and not _looks_like_jsonl(p):
        return load_dpr_tsv(p, prefix=p.name.split(".")[2] if p.name.count(".") > 2 else "dpr")
    return load_answer_jsonl(p, p.stem.split(".")[0])


_loaded: dict[tuple, list[Question]] = {}  # (format, path, size, mtime) -> the file's questions, this process


def load_questions(name: str, path: str) -> list[Question]:
    """Load a dataset by format name; ids must be unique. A file is parsed once per process while its size and
    modification time stay the same (parsing SQuAD dev is ~0.3 s, a fixed cost of every cached rerun in a
    long-lived process: a schedule server, a sweep, a benchmark); callers get their own copies."""
    return _copies(_parsed_once(name, path))


def check_questions(name: str, path: str) -> None:
    """Raise the DatasetError `load_questions` would raise; copies nothing (a run's checks, before its sample)."""
    _parsed_once(name, path)


def load_sample(name: str, path: str, limit: int | None, seed: int) -> list[Question]:
    """`sample_questions` of the dataset, only the sampled questions copied (a 20-question run of SQuAD dev copies
    20 questions, not 10,570)."""
    return _copies(sample_questions(_parsed_once(name, path), limit, seed))


def _copies(questions: list[Question]) -> list[Question]:
    # shallow copies through the constructor, every field included: an order of magnitude faster than copy.copy, on
    # the way to the first model call of a run (docs/performance.md, "Small costs behind the code")
    return [replace(q) for q in questions]


def _parsed_once(name: str, path: str) -> list[Question]:
    """The file's questions as parsed once in this process (shared: callers copy what they hand out)."""
    p = resolve_data_path(path)
    if not p.is_file():
        return _parse_questions(name, p)  # raises the loaders' file-not-found message
    key = (name, *file_identity(p))
    if key not in _loaded:
        if len(_loaded) >= 8:
            _loaded.pop(next(iter(_loaded)))
        _loaded[key] = _kept_questions(key) or _keep_questions(key, _parse_questions(name, p))
    return _loaded[key]


KEPT_QUESTIONS_VERSION = "1"  # bumped when Question's fields change: files kept before are then parsed again


def _kept_questions_path(key: tuple) -> Path:
    from core.paths import cache_home

    return cache_home() / "datasets" / f"{hashlib.sha256(repr((KEPT_QUESTIONS_VERSION, key)).encode()).hexdigest()}.pickle"


def _kept_questions(key: tuple) -> list[Question] | None:
    """A dataset file's questions as a process on this machine parsed them (a command's fixed cost: SQuAD dev's parse
    is ~0.3 s, its kept copy read in ~0.05 s), named by the file's identity (core/paths.py `file_identity`)."""
    import pickle

    try:
        questions = pickle.loads(_kept_questions_path(key).read_bytes())
    except Exception:  # none kept, unreadable or of another Question: parsed again
        return None
    return questions if isinstance(questions, list) and all(type(q) is Question for q in questions) else None


def _keep_questions(key: tuple, questions: list[Question]) -> list[Question]:
    import pickle

    from core.atomic import atomic_write_bytes

    path = _kept_questions_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, pickle.dumps(questions, protocol=pickle.HIGHEST_PROTOCOL))
    except OSError:  # an optimisation: a read-only or full cache home parses each time
        pass
    return questions


def _parse_questions(name: str, p: Path) -> list[Question]:
    if name not in DATASET_FORMATS:
        raise DatasetError(f"dataset.name: unknown dataset format {name!r}; known: {', '.join(DATASET_FORMATS)}")
    fmt = DATASET_FORMATS[name]
    questions = fmt.load(p)
    seen: dict[str, int] = {}
    for row, q in enumerate(questions, start=1):
        if q.qid in seen:
            if fmt.derived_ids and not q.qid.startswith("dup"):
                # derived ids of repeated questions: keep both, disambiguated by position
                q.qid = f"{q.qid}-{row}"
            else:
                raise DatasetError(f"{p}: row {row}: field 'id': duplicate id {q.qid!r} (first at row {seen[q.qid]})")
        seen[q.qid] = row
    if not questions:
        raise DatasetError(f"{p}: no questions found")
    return questions


def _looks_like_jsonl(path: Path) -> bool:
    with _open_text(path) as fh:
        first = fh.readline().strip()
    return first.startswith("{")


def sample_questions(questions: list[Question], limit: int | None, seed: int) -> list[Question]:
    """Seeded sample without replacement, in a stable order (the same spec gives the same questions)."""
    if limit is None or limit >= len(questions):
        return list(questions)
    ranked = sorted(questions, key=lambda q: hashlib.sha256(f"{seed}:{q.qid}".encode()).hexdigest())
    return ranked[:limit]


# ---- corpus -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CorpusFormat:
    """A passage file format, registered under its spec name (`corpus.name`) by `corpus_format`."""

    read: Callable[[list[Path], dict], Iterator[tuple[int, str, str, str]]]  # (files, shape) -> (row, pid, title, text)
    description: str
    one_file: bool = True  # takes exactly one file (else any number, read in order)
    # (files, shape) -> PassageBatch in file order: a reader that parses a block of rows at once (else `read`, batched)
    batches: Callable[[list[Path], dict], Iterator[PassageBatch]] | None = None


@dataclass
class PassageBatch:
    """Consecutive passages of a corpus file, as columns: rows first_row, first_row + 1, ... A reader that has each
    column's values as UTF-8 already gives them too (`utf8`: the values joined by b"\n", none of them holding one),
    so that encoding them again is spared (strategies/retrievers/corpus.py `JsonBatch`)."""

    first_row: int
    pids: list[str]
    titles: list[str]
    texts: list[str]
    utf8: tuple[bytes, bytes, bytes] | None = None  # (pids, titles, texts)

    def rows(self) -> Iterator[tuple[int, str, str, str]]:
        return zip(itertools.count(self.first_row), self.pids, self.titles, self.texts)


CORPUS_FORMATS: dict[str, CorpusFormat] = {}


def corpus_format(name: str, description: str, one_file: bool = True, batches=None):
    """Register a streaming reader `(files, shape) -> iterator of (row, pid, title, text)` as the corpus kind `name`;
    `shape` is a dict the reader may fill (`contents_only`: every row is Anserini's {id, contents}). `batches`, when
    given, reads the same rows as `PassageBatch`es (what a whole-corpus read uses: `iter_corpus_batches`)."""

    def register(read: Callable[[list[Path], dict], Iterator[tuple[int, str, str, str]]]):
        CORPUS_FORMATS[name] = CorpusFormat(read, description, one_file, batches)
        return read

    return register


DPR_TSV_HEADER = ["id", "text", "title"]  # psgs_w100.tsv, DPR's Wikipedia split (Karpukhin et al.)


def iter_corpus(name: str, paths: list[str], shape: dict | None = None) -> Iterator[tuple[int, str, str, str]]:
    """The passages of a corpus file (or files), streamed in file order as (row, pid, title, text): nothing of the
    corpus is held beyond the passage at hand, so a 21-million-passage file streams in constant memory. Malformed
    rows raise DatasetError naming file, row and field; duplicate ids are checked by `check_unique_ids`. `shape`, when
    given, learns whether every row of a JSON-lines file is exactly {id, contents} (`contents_only`): Anserini's own
    input, which an index build then reads in place."""
    fmt = _corpus_format(name, paths)
    yield from fmt.read([resolve_data_path(p) for p in paths], shape if shape is not None else {})


PASSAGE_BATCH = 4096  # rows a batch of a reader without its own `batches`


def iter_corpus_batches(name: str, paths: list[str], shape: dict | None = None) -> Iterator[PassageBatch]:
    """The passages of `iter_corpus`, a batch of rows at a time (a few thousand: memory stays flat)."""
    fmt = _corpus_format(name, paths)
    files, shape = [resolve_data_path(p) for p in paths], shape if shape is not None else {}
    if fmt.batches is not None:
        yield from fmt.batches(files, shape)
        return
    rows = fmt.read(files, shape)
    while chunk := list(itertools.islice(rows, PASSAGE_BATCH)):
        columns = zip(*((pid, title, text) for _, pid, title, text in chunk), strict=True)
        pids, titles, texts = (list(column) for column in columns)
        yield PassageBatch(chunk[0][0], pids, titles, texts)


def _corpus_format(name: str, paths: list[str]) -> CorpusFormat:
    fmt = CORPUS_FORMATS.get(name)
    if fmt is None:
        raise DatasetError(f"corpus.name: {name!r} is not a corpus file format ({', '.join(CORPUS_FORMATS)})")
    if fmt.one_file and len(paths) != 1:
        raise DatasetError(f"corpus.paths: a {name} corpus takes exactly one file, got {len(paths)}")
    return fmt


@corpus_format("squad-paragraphs", "the paragraphs of SQuAD JSON files", one_file=False)
def _iter_squad_corpus(paths: list[Path], shape: dict) -> Iterator[tuple[int, str, str, str]]:
    """All paragraphs of the given SQuAD files (a SQuAD file is read whole: the largest is ~40 MB)."""
    row = 0
    for p in paths:
        try:
            data = json.loads(_read_all(p))
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{p}: malformed JSON at line {exc.lineno}: {exc.msg}") from None
        for article in data.get("data", []):
            title = article.get("title", "")
            for p_idx, para in enumerate(article.get("paragraphs", [])):
                row += 1
                yield row, squad_pid(title, p_idx), title.replace("_", " "), para.get("context", "")
    if row == 0:
        raise DatasetError(f"corpus files {[str(p) for p in paths]}: no paragraphs found")


@corpus_format("jsonl", "JSON lines of {id, title?, text} (or Pyserini's {id, contents})")
def _iter_jsonl_corpus(paths: list[Path], shape: dict) -> Iterator[tuple[int, str, str, str]]:
    """JSON lines of {id, title?, text}; {id, contents} (Pyserini's JsonCollection) is read too, its first line as the
    title when it has more than one."""
    (p,) = paths
    found, contents_only = False, True
    decode = json.JSONDecoder().decode  # one decoder for every line (json.loads checks its arguments per call)
    with _open_text(p, newline="\n") as fh:
        for row, line in enumerate(_lines(fh, p), start=1):
            if not line or line.isspace():
                continue
            try:
                obj = decode(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{p}: row {row}: malformed JSON: {exc.msg}") from None
            if type(obj) is not dict:
                raise DatasetError(f"{p}: row {row}: expected a JSON object")
            pid, text, title = obj.get("id"), obj.get("text"), obj.get("title")
            contents = obj.get("contents")
            if text is None and type(contents) is str:
                title, sep, text = contents.partition("\n")
                if not sep:
                    title, text = "", contents
                contents_only = contents_only and len(obj) == 2 and type(pid) in (str, int)
            else:
                contents_only = False
            if pid is None or str(pid) == "":
                raise DatasetError(f"{p}: row {row}: field 'id' missing")
            if not isinstance(text, str) or not text.strip():
                raise DatasetError(f"{p}: row {row}: field 'text' is empty or missing")
            found = True
            yield row, str(pid), str(title or ""), text
    shape["contents_only"] = contents_only
    if not found:
        raise DatasetError(f"{p}: no passages found")


TSV_BLOCK = 1 << 22  # bytes of a TSV file (decompressed) split into rows at a time


def _dpr_tsv_batches(paths: list[Path], shape: dict) -> Iterator[PassageBatch]:
    """DPR's passage TSV: a header `id<TAB>text<TAB>title`, then one passage per row, fields quoted as CSV (a quoted
    field's quotes doubled inside). Rows are what csv.reader makes of the file's lines (split on \n only, line ends
    taken off, as `_lines` gives them); a block of lines where that is plain splitting (`_plain_columns`) is split
    with bytes operations over the whole block, any other block by csv.reader itself: the same rows either way."""
    (p,) = paths
    csv.field_size_limit(1 << 30)
    if not p.is_file():
        raise DatasetError(f"{p}: file not found")
    with p.open("rb") as raw:
        lines = _TsvLines(p, _gunzipped(p, raw) if p.suffix == ".gz" else iter(lambda: raw.read(TSV_BLOCK), b""))
        header = next(csv.reader(lines, delimiter="\t"), None)  # reads the header's line(s) only
        if header != DPR_TSV_HEADER:
            raise DatasetError(f"{p}: row 1: the header must be {chr(9).join(DPR_TSV_HEADER)!r} (DPR's psgs_w100.tsv), "
                               f"got {chr(9).join(header or [])[:80]!r}")
        row, found = 2, False
        while (block := lines.next_block()) is not None:
            batch = _plain_batch(row, block)
            if batch is None:  # csv.reader reads this block's lines (and on, while a quoted field runs past them)
                lines.put_back(block)
                batch = _csv_rows(p, lines, len(block), row)
            if batch.pids:
                found = True
                row += len(batch.pids)
                yield batch
    if not found:
        raise DatasetError(f"{p}: no passages found")


@corpus_format("dpr-tsv", "DPR's passage TSV (id, text, title)", batches=_dpr_tsv_batches)
def _iter_dpr_tsv(paths: list[Path], shape: dict) -> Iterator[tuple[int, str, str, str]]:
    for batch in _dpr_tsv_batches(paths, shape):
        yield from batch.rows()


def _gunzipped(p: Path, raw: io.BufferedIOBase) -> Iterator[bytes]:
    """A gzip file's content (every member, as gzip.open reads it, zero padding after a member skipped), in chunks of at
    most TSV_BLOCK bytes: zlib on a megabyte of input at a time costs a fifth less CPU than gzip.open's reads."""
    inflate, in_member = zlib.decompressobj(31), False
    try:
        while chunk := raw.read(1 << 20):
            while chunk:
                in_member = True
                yield inflate.decompress(chunk, TSV_BLOCK)
                chunk = inflate.unconsumed_tail
                if inflate.eof:  # a member's end: another may follow
                    chunk, inflate, in_member = inflate.unused_data.lstrip(b"\0"), zlib.decompressobj(31), False
    except zlib.error as exc:
        raise DatasetError(f"{p}: not a valid gzip file ({exc})") from None
    if in_member:
        raise DatasetError(f"{p}: the gzip file ends before its end marker (cut off?)")


class _TsvLines:
    """The lines of a TSV file as UTF-8 bytes, split on \n only and without their line ends (as `_lines` gives them),
    a block at a time (`next_block`), or one by one as text for csv.reader (iterating), from where the block put back
    last was left."""

    def __init__(self, p: Path, chunks: Iterator[bytes]):
        self.p, self.chunks = p, chunks
        self.rest = b""  # the start of a line whose end is not read yet
        self.block: list[bytes] = []
        self.pos = 0  # lines of `block` read one by one
        self.start = 0  # byte offset of block[0] in the (decompressed) file, for an error's message
        self.read = 0  # bytes read from the file
        self.handed = 0  # lines read one by one, in all

    def next_block(self) -> list[bytes] | None:
        """The lines not read yet: the rest of the current block, else the next block of the file."""
        if self.pos < len(self.block):
            self.start += sum(map(len, self.block[:self.pos])) + self.pos
            found, self.block, self.pos = self.block[self.pos:], [], 0
            return found
        return self._read()

    def put_back(self, block: list[bytes]) -> None:
        """The block `next_block` gave, to be read one by one."""
        self.block, self.pos = block, 0

    def _read(self) -> list[bytes] | None:
        while True:
            chunk = next(self.chunks, b"")
            self.start, data = self.read - len(self.rest), self.rest + chunk
            self.read += len(chunk)
            if not chunk:  # the file's end: its last line has no line end (kept as it is, as `_lines` keeps it)
                self.rest = b""
                return [data] if data else None
            cut = data.rfind(b"\n")
            if cut >= 0:
                break
            self.rest = data
        body, self.rest = data[:cut], data[cut + 1:]
        block = body.split(b"\n")
        return [line.rstrip(b"\r") for line in block] if b"\r" in body else block

    def __iter__(self) -> _TsvLines:
        return self

    def __next__(self) -> str:
        if self.pos >= len(self.block):
            block = self._read()
            if block is None:
                raise StopIteration
            self.block, self.pos = block, 0
        line = self.block[self.pos]
        self.pos += 1
        self.handed += 1
        try:
            return line.decode("utf-8")
        except UnicodeDecodeError as exc:
            offset = self.start + sum(map(len, self.block[:self.pos - 1])) + self.pos - 1 + exc.start
            raise DatasetError(f"{self.p}: not valid UTF-8 (byte offset {offset})") from None


def _csv_rows(p: Path, lines: _TsvLines, count: int, row: int) -> PassageBatch:
    """The rows csv.reader reads from the next `count` lines (and on, while a quoted field runs past them), checked
    one by one: the first bad row raises its DatasetError."""
    batch = PassageBatch(row, [], [], [])
    reader = csv.reader(lines, delimiter="\t")
    end = lines.handed + count
    try:
        while lines.handed < end and (rec := next(reader, None)) is not None:
            if len(rec) != 3:
                raise DatasetError(f"{p}: row {row}: expected 3 tab-separated fields (id, text, title), got {len(rec)}")
            pid, text, title = rec
            if not pid:
                raise DatasetError(f"{p}: row {row}: field 'id' missing")
            if not text.strip():
                raise DatasetError(f"{p}: row {row}: field 'text' is empty")
            batch.pids.append(pid)
            batch.titles.append(title)
            batch.texts.append(text)
            row += 1
    except csv.Error as exc:
        raise DatasetError(f"{p}: row {row}: {exc}") from None
    return batch


def _plain_batch(row: int, block: list[bytes]) -> PassageBatch | None:
    """The block's rows read by splitting (`_plain_columns`), when every one of them is good; else None (csv.reader
    then reads the block, and names the first bad row)."""
    columns = _plain_columns(block)
    if columns is None:
        return None
    try:
        pids, titles, texts = (column.decode("utf-8").split("\n") for column in columns)
    except UnicodeDecodeError:
        return None
    if "" in pids or not all(map(str.strip, texts)):
        return None
    return PassageBatch(row, pids, titles, texts, utf8=columns)


def _plain_columns(block: list[bytes]) -> tuple[bytes, bytes, bytes] | None:
    """The (id, title, text) columns of a block of lines, each its values joined by \n, when csv.reader would read
    each line as one row of three fields, as plain splitting does: no \r or NUL, two tabs a line, and each field
    either unquoted or one quoted whole (`_unquoted`). Else None, and csv.reader reads the block."""
    if not block or set(map(bytes.count, block, itertools.repeat(b"\t"))) != {2}:
        return None
    body = b"\t".join(block)
    if b"\r" in body or b"\0" in body:
        return None
    fields = body.split(b"\t")
    pids, texts, titles = (_unquoted(fields[i::3]) for i in range(3))
    if pids is None or texts is None or titles is None:
        return None
    return pids, titles, texts


def _unquoted(values: list[bytes]) -> bytes | None:
    """The values of one column (no tab or line break in any) as csv.reader reads them, joined by \n: an unquoted value
    as it is (a quote inside it is a character), a value in quotes without them, its doubled quotes single. None when
    a quoted value is anything else (a lone quote inside, text after the closing quote: csv.reader decides)."""
    firsts = {value[:1] for value in values}
    if b'"' not in firsts:
        return b"\n".join(values)
    if firsts == {b'"'} and {value[-1:] for value in values} == {b'"'} and b'"' not in values:
        joined = b"\n".join([value[1:-1] for value in values])  # each one quoted whole: its quotes off
    else:  # some quoted, some not: each on its own (a quote inside an unquoted value is a character)
        found = [_unquoted_one(value) for value in values]
        return None if None in found else b"\n".join(found)  # type: ignore[arg-type]
    quotes = joined.count(b'"')
    if quotes == 0:
        return joined
    return joined.replace(b'""', b'"') if quotes == 2 * joined.count(b'""') else None  # every quote doubled


def _unquoted_one(value: bytes) -> bytes | None:
    if not value.startswith(b'"'):
        return value
    inner = value[1:-1]
    if len(value) < 2 or not value.endswith(b'"') or inner.count(b'"') != 2 * inner.count(b'""'):
        return None
    return inner.replace(b'""', b'"')


def _lines(fh: io.TextIOBase, p: Path) -> Iterator[str]:
    """Lines of a file opened with newline="\\n" (split on \\n only: str.splitlines() would also split inside text
    holding U+2028 or U+0085), read as they come, without their line end; invalid UTF-8 is named with its file."""
    try:
        for line in fh:
            yield line.rstrip("\r\n") if line.endswith("\n") else line
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{p}: not valid UTF-8 (byte offset {exc.start})") from None


def check_unique_ids(name: str, paths: list[str], pid_hashes: Sequence[int]) -> None:
    """Duplicate passage ids, found in bounded memory: the caller collected one 64-bit hash per id while streaming
    (8 bytes a passage); only when two hashes are equal is the corpus streamed again to name the rows."""
    import numpy as np

    hashes = np.sort(np.asarray(pid_hashes, dtype=np.uint64))  # an array('Q') is read through its buffer
    twice = set(hashes[1:][hashes[1:] == hashes[:-1]].tolist())
    if not twice:
        return
    first: dict[str, int] = {}
    for row, pid, _, _ in iter_corpus(name, paths):
        if pid_hash(pid) in twice:
            if pid in first:
                where = paths[0] if CORPUS_FORMATS[name].one_file else f"corpus files {paths}"
                raise DatasetError(f"{where}: row {row}: field 'id': duplicate id {pid!r} (first at row {first[pid]})")
            first[pid] = row


def pid_hash(pid: str) -> int:
    """A 64-bit hash of a passage id, stable within one process (Python's own string hash, cached on the string):
    a corpus's ids are hashed and, on a collision, re-hashed by the same process."""
    return hash(pid) & 0xFFFF_FFFF_FFFF_FFFF
