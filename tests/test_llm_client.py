"""The LLM client against a scripted OpenAI-compatible server (a stand-in for vLLM/OpenAI)."""

import asyncio
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from engines import call_processes, concurrency
from engines.llm import BackendError, HeadStartCalls, LLMClient, LLMRequest, run_on_engine
from engines.llm_cache import LLMCallCache
from engines.llm_types import Endpoint
from tests.fakes.openai_server import Faults, ScriptedServer


def req(prompt="Q: capital of France?", **kw):
    base = dict(system="sys", prompt=prompt, temperature=0.0, top_p=1.0, max_tokens=8, seed=0)
    return LLMRequest(**{**base, **kw})


def client(server, cache=None, **kw):
    endpoint = Endpoint(base_url=server.base_url, model="scripted", backoff_base_s=0.01, backoff_max_s=0.05, **kw)
    return LLMClient(endpoint, model_identity="fake", cache=cache)


def test_cache_makes_identical_calls_once(tmp_path):
    with ScriptedServer(answer=lambda s, p, b: "Paris") as server:
        cache = LLMCallCache(tmp_path / "c.sqlite")
        c = client(server, cache)
        first = run_on_engine(c.complete(req()))
        second = run_on_engine(c.complete(req()))
        other_sample = run_on_engine(c.complete(req(sample_index=1)))
        assert first.text == second.text == other_sample.text == "Paris"
        assert not first.from_cache and second.from_cache and not other_sample.from_cache
        assert server.calls == 2 and c.counters.calls == 2 and c.counters.cache_hits == 1
        # a second process-level client on the same cache file also hits
        c2 = client(server, LLMCallCache(tmp_path / "c.sqlite"))
        assert run_on_engine(c2.complete(req())).from_cache and server.calls == 2


def test_an_uncached_call_is_looked_up_in_the_cache_once(tmp_path, monkeypatch):
    """The client looks a call up before sending it; the model-call process then claims it without looking it up
    again (the claim is refused for a call answered meanwhile). Both halves run in this process here, the model-call
    process's through its own `cached_call`, so every lookup is counted."""
    from engines import model_call_process

    lookups = []
    real_get = LLMCallCache.get
    monkeypatch.setattr(LLMCallCache, "get", lambda self, key: lookups.append(key) or real_get(self, key))
    caches = model_call_process._Caches()

    def in_this_process(self, loop, request, key, rounds_after):
        return model_call_process.cached_call(caches, self.endpoint, request, key, str(self.cache.path), 5.0)

    monkeypatch.setattr(LLMClient, "_call", in_this_process)
    with ScriptedServer(answer=lambda s, p, b: "Paris") as server:
        c = client(server, LLMCallCache(tmp_path / "c.sqlite"))
        assert not run_on_engine(c.complete(req())).from_cache
        assert server.calls == 1 and len(lookups) == 1
        assert run_on_engine(c.complete(req())).from_cache and len(lookups) == 2  # answered: one lookup, no call
        # sent by the model-call process although answered meanwhile (a head start's early call): its claim is
        # refused, and the answer is looked up, not asked of the model
        assert run_on_engine(in_this_process(c, None, req(), c.cache_key(req()), 0)).from_cache
        assert server.calls == 1 and len(lookups) == 3


def test_seed_per_sample_and_logprobs():
    with ScriptedServer(answer=lambda s, p, b: "a b", logprob=-0.25) as server:
        c = client(server)
        r = run_on_engine(c.complete(req(sample_index=3, logprobs=True)))
        assert server.requests[-1]["seed"] == 3
        assert r.mean_logprob == pytest.approx(-0.25)
        assert run_on_engine(c.complete(req(prompt="x"))).mean_logprob is None


def test_cache_key_covers_everything_that_changes_the_answer():
    with ScriptedServer() as server:
        c = client(server)
        base = c.cache_key(req())
        assert c.cache_key(req()) == base
        # the key every existing call cache holds (a different one would orphan them all)
        from dataclasses import asdict

        from tracking.store.events import stable_hash

        assert base == stable_hash("llm-call", "fake", "scripted", asdict(req()), length=40)
        for change in (dict(prompt="other"), dict(system="other"), dict(temperature=0.7), dict(top_p=0.9),
                       dict(max_tokens=9), dict(seed=1), dict(sample_index=1), dict(logprobs=True)):
            assert c.cache_key(req(**change)) != base, change
        other_backend = LLMClient(Endpoint(server.base_url, "scripted"), model_identity="other", cache=None)
        assert other_backend.cache_key(req()) != base


def test_a_call_is_keyed_by_the_model_not_the_url_and_a_cache_keyed_by_url_still_answers(tmp_path):
    """A server moved to another host or port answers from the calls cached before; a cache written when keys named
    the server's URL (llm_types.endpoint_identity) answers too, and keeps the call under its new key."""
    from dataclasses import asdict

    from engines.llm_types import endpoint_identity, model_identity
    from schemas.spec import ModelSpec
    from tracking.store.events import stable_hash

    with ScriptedServer(answer=lambda s, p, b: "Paris") as first, ScriptedServer(answer=lambda s, p, b: "Lyon") as moved:
        def on(server, cache):
            spec = ModelSpec(backend="openai", name="scripted", base_url=server.base_url)
            return LLMClient(Endpoint(server.base_url, "scripted"), model_identity(spec), cache=cache,
                             legacy_identity=endpoint_identity(spec, server.base_url))

        cache = LLMCallCache(tmp_path / "c.sqlite")
        assert run_on_engine(on(first, cache).complete(req())).text == "Paris"
        again = run_on_engine(on(moved, cache).complete(req()))
        assert again.text == "Paris" and again.from_cache and moved.calls == 0
        assert on(first, None).cache_key(req()) == stable_hash("llm-call", "openai-compatible:scripted", "scripted",
                                                               asdict(req()), length=40)

        # a call cached under the URL's key, as every cache written before holds it (written as that code did)
        import json
        import sqlite3

        url_key = stable_hash("llm-call", f"openai-compatible:{first.base_url}", "scripted", asdict(req("old")),
                              length=40)
        with sqlite3.connect(tmp_path / "old.sqlite") as db:
            db.execute("CREATE TABLE llm_calls (key TEXT PRIMARY KEY, response TEXT NOT NULL,"
                       " created_at TEXT DEFAULT CURRENT_TIMESTAMP)")
            db.execute("INSERT INTO llm_calls (key, response) VALUES (?, ?)", (url_key, json.dumps(
                {"text": "Rome", "mean_logprob": None, "tokens_in": 3, "tokens_out": 1, "latency_ms": 5.0})))
        old = LLMCallCache(tmp_path / "old.sqlite")
        assert old.may_hold_url_keys and not cache.may_hold_url_keys  # a cache created since is never asked for them
        c = on(first, old)
        answered = run_on_engine(c.complete(req("old")))
        assert answered.text == "Rome" and answered.from_cache and first.calls == 1
        assert old.get(c.cache_key(req("old")))["text"] == "Rome"  # kept under the model's key from now on
        cache.put_many([("0" * 40, {"text": "x", "mean_logprob": None, "tokens_in": 1, "tokens_out": 1, "latency_ms": 1.0})])
        assert cache.may_hold_url_keys and LLMCallCache(tmp_path / "c.sqlite").may_hold_url_keys  # a pack may hold them


def test_faults_are_retried_until_success():
    faults = Faults(http_500=0.3, http_429=0.1, malformed=0.1, empty=0.1, seed=7)
    with ScriptedServer(answer=lambda s, p, b: p.upper(), faults=faults) as server:
        c = client(server, max_retries=20)

        async def many():
            import asyncio

            return await asyncio.gather(*(c.complete(req(prompt=f"q{i}")) for i in range(60)))

        results = run_on_engine(many())
        assert [r.text for r in results] == [f"Q{i}" for i in range(60)]
        injected = sum(server.faults_injected.values())
        assert injected > 10
        assert c.counters.retries == injected == sum(r.retries for r in results)
        print(f"faults injected {server.faults_injected}, retries {c.counters.retries}")


def test_retry_after_is_honoured():
    faults = Faults(http_429=1.0, retry_after_s=0.3)
    with ScriptedServer(faults=faults) as server:
        c = client(server, max_retries=2)
        import time

        t = time.perf_counter()
        with pytest.raises(BackendError, match="gave up after 3 attempts; last error: HTTP 429"):
            run_on_engine(c.complete(req()))
        assert time.perf_counter() - t >= 0.6  # two waits of Retry-After, not the 0.01 s backoff


def test_client_errors_are_not_retried():
    with ScriptedServer() as server:
        c = LLMClient(Endpoint(server.base_url.replace("/v1", "/nope"), "m"), model_identity="x", cache=None)
        with pytest.raises(BackendError, match="HTTP 404"):
            run_on_engine(c.complete(req()))


def test_backend_down_fails_within_bounded_time():
    import time

    c = LLMClient(Endpoint("http://127.0.0.1:9/v1", "m", max_retries=2, backoff_base_s=0.01, backoff_max_s=0.02,
                           timeout_s=2), model_identity="x", cache=None)
    t = time.perf_counter()
    with pytest.raises(BackendError, match="APIConnectionError"):
        run_on_engine(c.complete(req()))
    assert time.perf_counter() - t < 10


def test_identical_requests_in_flight_make_one_model_call(tmp_path):
    """Strategies sharing a call in the same round (concat_pf round 1 = concatenation) call the model once."""
    import asyncio

    with ScriptedServer(answer=lambda s, p, b: "Paris", delay_s=0.2, logprob=-0.3) as server:
        c = client(server, LLMCallCache(tmp_path / "c.sqlite"))

        async def burst():
            return await asyncio.gather(*(c.complete(req(logprobs=True)) for _ in range(4)), c.complete(req(prompt="other")))

        results = run_on_engine(burst())
        assert server.calls == 2 and c.counters.calls == 2 and c.counters.cache_hits == 3
        assert [r.from_cache for r in results[:4]].count(False) == 1
        assert {r.text for r in results} == {"Paris"} and [r.mean_logprob for r in results[:4]] == pytest.approx([-0.3] * 4)
    with ScriptedServer(faults=Faults(http_500=1.0)) as down:  # a failure reaches every waiter, once
        c = client(down, max_retries=1)

        async def failing():
            return await asyncio.gather(*(c.complete(req()) for _ in range(3)), return_exceptions=True)

        errors = run_on_engine(failing())
        assert all(isinstance(e, BackendError) for e in errors) and len(down.faults_injected) == 1
        assert down.faults_injected["http_500"] == 2  # one request and its one retry, not three


def test_logprob_calls_go_to_the_logprobs_endpoint_under_one_concurrency_bound():
    """The embedded backend runs a second server (logits_all) for log-probability calls only; both servers
    share one CPU, so the client keeps one concurrency bound across them."""
    import asyncio
    import threading
    import time

    lock, in_flight, most = threading.Lock(), [0], [0]

    def answering(text):
        def answer(system, prompt, body):  # runs in the server's thread; blocking holds this request open
            with lock:
                in_flight[0] += 1
                most[0] = max(most[0], in_flight[0])
            time.sleep(0.1)
            with lock:
                in_flight[0] -= 1
            return text
        return answer

    with ScriptedServer(answer=answering("plain")) as main, \
            ScriptedServer(answer=answering("with logprobs"), logprob=-0.1) as lp:
        c = client(main, logprobs_base_url=lp.base_url, concurrency=1)

        async def mixed():
            prompts = [("q1", False), ("q2", True), ("q3", False), ("q4", True)]
            return await asyncio.gather(*(c.complete(req(p, logprobs=lp_)) for p, lp_ in prompts))

        r1, r2, r3, r4 = run_on_engine(mixed())
        assert (r1.text, r2.text, r3.text, r4.text) == ("plain", "with logprobs", "plain", "with logprobs")
        assert r2.mean_logprob == pytest.approx(-0.1) and r1.mean_logprob is None
        assert main.calls == 2 and lp.calls == 2
        assert not any(r.get("logprobs") for r in main.requests) and all(r["logprobs"] for r in lp.requests)
        assert most[0] == 1  # never a call on both servers at once: the bound is shared, not per server


def test_worker_processes_share_the_concurrency_bound():
    from engines.concurrency import process_share

    assert process_share(64, 1) == 64
    assert (process_share(64, 2), process_share(3, 2), process_share(1, 2), process_share(8, 0)) == (32, 1, 1, 8)


def test_the_bound_is_divided_in_one_place():
    """engines/concurrency.py: a process's bound over its model-call processes, the shares adding up to it, and what
    the parent hands out at most (the shares plus a backlog each)."""
    assert [concurrency.call_process_share(65, i, 2) for i in range(2)] == [33, 32]
    assert [concurrency.call_process_share(7, i, 3) for i in range(3)] == [3, 2, 2]
    assert concurrency.outstanding_bound(64, 2) == 64 + 2 * concurrency.BACKLOG_PER_CALL_PROCESS


def test_an_endpoint_found_down_fails_the_queued_calls_at_once(monkeypatch):
    """A server that died (nothing listens on its port any more): the first call spends its retries, the calls
    queued behind it fail at once, naming the cause, instead of each retrying for ~30 s in its concurrency slot."""
    import asyncio
    import socket


    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = LLMClient(Endpoint(f"http://127.0.0.1:{port}/v1", "m", backoff_base_s=0.01, backoff_max_s=0.02, max_retries=3,
                              concurrency=1), model_identity="fake", cache=None)

    async def queued():
        return await asyncio.gather(*(dead.complete(req(prompt=f"q{i}")) for i in range(6)), return_exceptions=True)

    errors = run_on_engine(queued())
    assert all(isinstance(e, BackendError) for e in errors), errors
    gave_up = [str(e) for e in errors if "gave up after 4 attempts" in str(e)]
    fast = [str(e) for e in errors if "not reachable: a call gave up on it" in str(e)]
    assert len(gave_up) == 1 and len(fast) == 5, errors
    assert "ConnectionRefusedError" in gave_up[0] and "ConnectionRefusedError" in fast[0]
    # the mark expires: a later run tries the endpoint again (its own retries)
    monkeypatch.setattr(call_processes, "UNREACHABLE_FOR_S", 0.0)
    with pytest.raises(BackendError, match="gave up after 4 attempts"):
        run_on_engine(dead.complete(req(prompt="later")))


def test_a_local_server_that_refuses_is_given_up_at_once():
    """The embedded backend's server (`local_server`) refuses connections only once it has exited: the call gives up
    on its first refusal, not after ~30 s of backoff, so the run can name how the server died (engines/embedded.py).
    A remote endpoint keeps its retries (it may be restarting)."""
    import socket

    for local, attempts in ((True, "1 attempt;"), (False, "4 attempts;")):
        with socket.socket() as s:  # a port that nothing listens on (one each: a give-up marks its endpoint down)
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ep = Endpoint(f"http://127.0.0.1:{port}/v1", "m", backoff_base_s=0.01, backoff_max_s=0.02, max_retries=3,
                      local_server=local)
        with pytest.raises(BackendError, match=f"gave up after {attempts} last error: .*ConnectionRefusedError"):
            run_on_engine(LLMClient(ep, model_identity="fake", cache=None).complete(req(prompt=f"local={local}")))


def test_a_server_answering_errors_is_not_marked_unreachable():
    """HTTP 500s come from a live server: every call keeps its own retries (it may recover)."""
    import asyncio

    with ScriptedServer(faults=Faults(http_500=1.0)) as failing:
        c = client(failing, max_retries=1)

        async def several():
            return await asyncio.gather(*(c.complete(req(prompt=f"q{i}")) for i in range(3)), return_exceptions=True)

        errors = run_on_engine(several())
        assert all("gave up after 2 attempts" in str(e) for e in errors), errors
        assert failing.faults_injected["http_500"] == 6


# ---- the model-call process (engines.model_call_process) --------------------------------------------------------------

def _call_process_pids() -> list[int]:

    return [p._proc.pid for pool in call_processes._PROCESSES.values() for p in pool.processes
            if p._proc is not None and p._proc.returncode is None]


def _call_process_pid() -> int:
    """The first model-call process: the one every endpoint with a small concurrency bound uses."""

    (pool,) = [call_processes._PROCESSES[id(call_processes._engine_loop)]]
    proc = pool.processes[0]._proc
    assert proc is not None and proc.returncode is None
    return proc.pid


def test_an_endpoint_allowing_many_requests_in_flight_spreads_them_over_processes_under_one_bound(monkeypatch):
    """64 in flight: two model-call processes, 32 each (REQUESTS_PER_CALL_PROCESS), so together never more than
    the endpoint's bound, and both used."""
    import asyncio


    monkeypatch.setattr(concurrency, "MAX_CALL_PROCESSES", 2)  # as on a 2-core machine, whatever this one has
    assert [concurrency.call_processes_for(c) for c in (1, 4, 31, 32, 63, 64, 65, 256)] == [1, 1, 1, 1, 1, 2, 2, 2]
    with ScriptedServer(answer=lambda s, p, b: p.upper(), delay_s=0.1) as server:
        c = client(server, concurrency=65)

        async def many(n: int, tag: str):
            return await asyncio.gather(*(c.complete(req(prompt=f"{tag}{i}")) for i in range(n)))

        async def both_answered() -> list[bool]:
            return [p.answered for p in call_processes.call_processes_of(asyncio.get_running_loop()).processes]

        # both processes answering before the burst (a call goes to a process that has answered while it has room;
        # 40 at once overflow the first one's share of 33 into the second, which answers once its imports are done,
        # however long a loaded machine takes): the burst below then cannot finish on the first alone
        assert [a.text for a in run_on_engine(many(40, "w"))] == [f"W{i}" for i in range(40)]
        assert run_on_engine(both_answered()) == [True, True]
        server.max_in_flight = 0  # the burst's own
        answers = run_on_engine(many(400, "q"))
        assert [a.text for a in answers] == [f"Q{i}" for i in range(400)]
        assert 34 <= server.max_in_flight <= 65, server.max_in_flight  # more than the first share (33): both ran
        assert server.calls == 440 and c.counters.calls == 440
        assert len(set(_call_process_pids())) >= 2


def test_calls_wait_here_beyond_a_small_backlog_per_process_so_the_processes_finish_together(monkeypatch):
    """A burst far larger than the bound is handed out as slots free, not all when queued: no process ever holds
    more than its share plus BACKLOG_PER_CALL_PROCESS, so none is left alone with the end of a shard."""
    import asyncio


    monkeypatch.setattr(concurrency, "MAX_CALL_PROCESSES", 2)
    monkeypatch.setattr(concurrency, "BACKLOG_PER_CALL_PROCESS", 3)
    with ScriptedServer(answer=lambda s, p, b: p.upper(), delay_s=0.02) as server:
        c = client(server, concurrency=64)
        most: list[int] = []

        async def burst():
            calls = asyncio.gather(*(c.complete(req(prompt=f"b{i}")) for i in range(600)))
            processes = call_processes.call_processes_of(asyncio.get_running_loop()).processes
            while not calls.done():
                most.append(max((p.outstanding for p in processes), default=0))
                await asyncio.sleep(0.005)
            return await calls

        answers = run_on_engine(burst())
        assert [a.text for a in answers] == [f"B{i}" for i in range(600)]
        assert server.calls == 600
        assert 32 <= max(most) <= 32 + 3, max(most)  # a process's share is 32; queued all at once it would be 300


def test_processes_held_back_take_no_call_until_released(monkeypatch):
    """A run's head start starts one model-call process and holds the others back while the JVM starts
    (flows/head_start.py): meanwhile calls stay within the first process's share of the bound (33 of 65); released,
    the others take calls again."""
    import asyncio


    monkeypatch.setattr(concurrency, "MAX_CALL_PROCESSES", 2)
    with ScriptedServer(answer=lambda s, p, b: p.upper(), delay_s=0.05) as server:
        c = client(server, concurrency=65)

        async def many(n: int, tag: str):
            return await asyncio.gather(*(c.complete(req(prompt=f"{tag}{i}")) for i in range(n)))

        c.start_call_processes(at_most=1)
        try:
            assert len(run_on_engine(many(200, "held"))) == 200
            assert server.max_in_flight <= 33, server.max_in_flight
        finally:
            c.start_call_processes()
        server.max_in_flight = 0
        assert len(run_on_engine(many(200, "free"))) == 200
        assert server.max_in_flight > 33, server.max_in_flight


def test_calls_in_flight_when_the_model_call_process_dies_fail_by_name_and_the_next_call_starts_a_new_one():
    import asyncio
    import os
    import signal

    with ScriptedServer(delay_s=2.0) as server:
        c = client(server, concurrency=4)
        run_on_engine(c.complete(req(prompt="warm up")))  # starts the process
        pid = _call_process_pid()

        async def kill_while_waiting():
            calls = asyncio.gather(*(c.complete(req(prompt=f"q{i}")) for i in range(3)), return_exceptions=True)
            await asyncio.sleep(0.5)
            os.kill(pid, signal.SIGKILL)
            return await calls

        errors = run_on_engine(kill_while_waiting())
        assert all(isinstance(e, BackendError) for e in errors), errors
        assert all("model-call process" in str(e) and "exited with code -9" in str(e) for e in errors), errors
        again = run_on_engine(c.complete(req(prompt="after the kill")))
        assert again.text and not again.from_cache
        assert _call_process_pid() != pid


def test_the_model_call_process_ends_with_the_process_that_started_it(tmp_path):
    """A run killed with SIGKILL leaves no model-call process behind (the parent-death signal)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import REPO

    with ScriptedServer() as server:
        script = (
            "from engines.llm import LLMClient, LLMRequest, run_on_engine\n"
            "from engines.llm_types import Endpoint\n"
            "from tests.test_llm_client import _call_process_pid\n"
            f"c = LLMClient(Endpoint({server.base_url!r}, 'm'), model_identity='x', cache=None)\n"
            "run_on_engine(c.complete(LLMRequest('s', 'Q: who?', 0.0, 1.0, 8, 0)))\n"
            "print(_call_process_pid(), flush=True)\n"
            "import time; time.sleep(120)\n"
        )
        parent = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True)
        child = int(parent.stdout.readline())
        os.kill(child, 0)  # running
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                return
            with open(f"/proc/{child}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":  # exited, not yet reaped: gone
                    return
            time.sleep(0.1)
        pytest.fail(f"model-call process {child} still running 10 s after its parent was killed")


def test_many_connections_opening_a_new_cache_file_at_once_all_succeed(tmp_path):
    """Concurrent retrieve/generate tasks (and Dask workers) open the same new llm_cache.sqlite together; switching it
    to WAL must not fail with "database is locked" (it did, in the compress/parametric flow test)."""
    from concurrent.futures import ThreadPoolExecutor

    for trial in range(5):
        path = tmp_path / f"c{trial}" / "llm_cache.sqlite"
        with ThreadPoolExecutor(16) as pool:
            caches = list(pool.map(LLMCallCache, [path] * 16))
        caches[0].put("k", {"text": "x"})
        assert all(c.get("k") == {"text": "x"} for c in caches)
        for c in caches:
            c.close()


def test_a_call_answered_before_does_not_queue_behind_the_calls_in_flight(tmp_path):
    """Two questions of a run with the same text and passages make the same call. Once it is answered, the second
    takes the cached answer at once; it used to join the back of the queue (a head start's 10,000 calls: its shard,
    vote and evaluation then finished last). Here 400 calls to a server answering after 1 s, 64 in flight, are
    queued ahead of it: it must come back before the first of them is answered."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.fakes.latency_server", "--delay", "1.0"],
                            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
    try:
        line = proc.stdout.readline().split()
        assert line and line[0] == "ready", line
        base_url = f"http://127.0.0.1:{line[1]}"
        c = LLMClient(Endpoint(base_url=f"{base_url}/v1", model="latency", concurrency=64), model_identity="fake",
                      cache=LLMCallCache(tmp_path / "c.sqlite"), head_start_calls=HeadStartCalls())
        assert not run_on_engine(c.complete(req("Question: answered before?"))).from_cache
        queued = [req(f"Question: queued {i}?") for i in range(400)]
        c.send_head_start(queued)
        again = run_on_engine(c.complete(req("Question: answered before?")))
        with urllib.request.urlopen(f"{base_url}/stats", timeout=10) as r:
            answered = json.loads(r.read())["requests"]
        assert again.from_cache and answered == 1, answered  # only the first call: none of the 400 yet
        assert c.counters.calls == 1 and c.counters.cache_hits == 1
        # the 400 taken over, as a stage task takes its early calls: none is left for another test to find
        async def take_over() -> list:
            return await asyncio.gather(*(c.complete(q) for q in queued))

        run_on_engine(take_over())
        assert c.counters.calls == 401 and len(c.head_start_calls) == 0
    finally:
        proc.terminate()
        proc.wait(timeout=10)
