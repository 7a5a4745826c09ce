"""engines/java.py: a JVM that will search only a few thousand queries starts with the C1 compiler only; any other
keeps the JVM's default tiered compilation. Each case starts its own JVM in a fresh process and reads the JVM's own
input arguments back."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SCRIPT = """
import sys
from engines import java
java.expect_queries(None if sys.argv[1] == "none" else int(sys.argv[1]))
java.ensure_jvm()
from jnius import autoclass
args = autoclass("java.lang.management.ManagementFactory").getRuntimeMXBean().getInputArguments()
print("\\n".join(args.get(i) for i in range(args.size())))
"""


@pytest.mark.parametrize(("queries", "c1_only"), [("2000", True), ("4000", True), ("4001", False), ("none", False)])
def test_the_jvm_compiler_follows_the_queries_expected(queries, c1_only):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, queries], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "JAVA_TOOL_OPTIONS"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    arguments = proc.stdout.split()
    assert "-Xmx4g" in arguments  # ragledger's own options reached the JVM
    assert ("-XX:TieredStopAtLevel=1" in arguments) is c1_only, arguments
