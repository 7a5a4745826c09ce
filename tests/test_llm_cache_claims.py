"""Claims on calls in flight (engines/llm_cache.py): a process making a call holds it, so another process asking the
same call waits for the answer instead of calling again; a dead or stale holder's claim is taken over."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import engines.llm_cache as llm_cache
from engines.llm_cache import LLMCallCache


def as_owner(monkeypatch, pid: int) -> None:
    monkeypatch.setattr(llm_cache, "OWNER", f"{socket.gethostname()}:{pid}")


def test_a_live_holders_claim_makes_others_wait_until_its_answer(tmp_path, monkeypatch):
    cache = LLMCallCache(tmp_path / "llm.sqlite")
    as_owner(monkeypatch, os.getpid())
    assert cache.claim("k", stale_after_s=600)
    assert cache.claim("k", stale_after_s=600)  # its own claim
    as_owner(monkeypatch, os.getppid())  # another live process
    assert not cache.claim("k", stale_after_s=600)
    as_owner(monkeypatch, os.getpid())
    cache.put("k", {"text": "Denver"})  # the answer ends the claim
    as_owner(monkeypatch, os.getppid())
    assert cache.get("k") == {"text": "Denver"}
    assert not cache.claim("k", stale_after_s=600)  # answered: taken from the cache, never made again
    assert cache.claim("k2", stale_after_s=600)  # another call: nobody holds it


def test_a_failed_call_releases_its_claim(tmp_path, monkeypatch):
    cache = LLMCallCache(tmp_path / "llm.sqlite")
    as_owner(monkeypatch, os.getpid())
    assert cache.claim("k", stale_after_s=600)
    cache.release("k")
    as_owner(monkeypatch, os.getppid())
    assert cache.claim("k", stale_after_s=600)


def test_a_dead_or_stale_holders_claim_is_taken_over(tmp_path, monkeypatch):
    cache = LLMCallCache(tmp_path / "llm.sqlite")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    as_owner(monkeypatch, dead.pid)
    assert cache.claim("k", stale_after_s=600)
    as_owner(monkeypatch, os.getpid())
    assert cache.claim("k", stale_after_s=600)  # its holder exited
    as_owner(monkeypatch, os.getppid())
    assert not cache.claim("k", stale_after_s=600)
    assert cache.claim("k", stale_after_s=0)  # held longer than a call and its retries can take
