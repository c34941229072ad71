"""The answers verdict: the comparison rule, the probe's request and parsing, and what a failure says.

The answers here are built by hand (token ids with their top-k logprobs), because a near tie or a cache
that serves wrong content cannot be produced on demand on a healthy server; the real-vLLM evidence, a
faulted cache that fails and a healthy one that passes, is in test_e2e_fault.py.
"""

from __future__ import annotations

import json

import pytest

from pytest_apc.measure.answers import Answer, Probe, ProbeError, parse_answer, probe_indices, request_body
from pytest_apc.measure.records import Measured, Repeat, RunRecord
from pytest_apc.serving import metrics
from pytest_apc.serving.interface import ServerInfo
from pytest_apc.verdicts import Pair, answers
from pytest_apc.workload.cases import RunKey, Workload


def answer(tokens: list[int], runner_up: int | None = None, gap: float = 3.0) -> Answer:
    """Greedy ``tokens``; at each position the runner-up is ``runner_up`` (else token + 1000), ``gap`` below."""
    top = [{t: -0.1, (runner_up if runner_up is not None else t + 1000): -0.1 - gap} for t in tokens]
    return Answer(tokens, " ".join(map(str, tokens)), top)


def test_identical_answers() -> None:
    assert answers.compare(0, answer([1, 2, 3]), answer([1, 2, 3])).outcome == answers.IDENTICAL


def test_a_near_tie_stops_the_comparison() -> None:
    a = Answer([1, 2, 3], "a", [{1: -0.1}, {2: -0.70, 7: -0.71}, {3: -0.1}])
    b = Answer([1, 7, 9], "b", [{1: -0.1}, {7: -0.69, 2: -0.70}, {9: -0.1}])
    found = answers.compare(4, a, b)
    assert (found.outcome, found.position, found.tokens) == (answers.NEAR_TIE, 1, (2, 7))
    assert found.gap_nats == pytest.approx(0.01)


def test_tokens_outside_each_others_top_k_differ() -> None:
    found = answers.compare(2, answer([1, 2, 3]), answer([1, 5, 3]))
    assert (found.outcome, found.position, found.tokens) == (answers.DIFFER, 1, (2, 5))


def test_one_sided_top_k_is_not_a_tie() -> None:
    """Each token must be in the other's top-k: a wrong answer whose own top-k happens to hold the right
    token is still wrong."""
    a = Answer([1, 2], "a", [{1: 0.0}, {2: -0.1, 9: -5.0}])
    b = Answer([1, 5], "b", [{1: 0.0}, {5: -0.1, 2: -0.2}])
    assert answers.compare(0, a, b).outcome == answers.DIFFER


def test_a_shorter_answer_differs() -> None:
    assert answers.compare(0, answer([1, 2, 3]), answer([1, 2])).outcome == answers.DIFFER


def test_probe_indices_spread_over_the_run() -> None:
    assert probe_indices(30, 4) == [0, 10, 19, 29]
    assert probe_indices(3, 8) == [0, 1, 2]
    assert probe_indices(30, 1) == [0]


def test_request_body_is_the_benchmarks_message_greedy_with_token_ids() -> None:
    body = request_body("m", "hello", max_tokens=16, top_k=5, salt="s-1")
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    assert (body["temperature"], body["max_tokens"], body["top_logprobs"], body["cache_salt"]) == (0, 16, 5, "s-1")
    assert body["return_tokens_as_token_ids"] is True
    assert "cache_salt" not in request_body("m", "hello", max_tokens=16, top_k=5)
    chat = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert request_body("m", chat, max_tokens=1, top_k=1)["messages"] == chat


def reply(tokens: list[str]) -> dict:
    content = [{"token": t, "logprob": -0.5, "top_logprobs": [{"token": t, "logprob": -0.5}]} for t in tokens]
    return {"choices": [{"message": {"content": "text"}, "logprobs": {"content": content}}]}


def test_parse_answer_reads_token_ids() -> None:
    parsed = parse_answer(reply(["token_id:5", "token_id:17"]))
    assert parsed.tokens == [5, 17]
    assert parsed.top == [{5: -0.5}, {17: -0.5}]


def test_parse_answer_refuses_token_strings() -> None:
    """A server that ignored return_tokens_as_token_ids gives strings, which may split a character."""
    with pytest.raises(ProbeError, match="not an id"):
        parse_answer(reply(["\u00e9"]))
    with pytest.raises(ProbeError, match="no token logprobs"):
        parse_answer({"choices": [{"message": {"content": "x"}}]})


def run(
    case: str,
    probes: list[Probe],
    error: str | None = None,
    texts: list[str] | list[list[str]] | None = None,
    command: tuple[str, ...] = ("vllm", "serve", "m"),
    kv_cache_line: str | None = None,
) -> RunRecord:
    """A run of ``case`` at concurrency 8; ``texts`` its benchmark's generated texts (a list per repeat, or
    one list for a single repeat)."""
    key = RunKey(case, 8)
    per_repeat: list[list[str] | None] = [None]
    if texts is not None:
        per_repeat = texts if texts and isinstance(texts[0], list) else [texts]  # type: ignore[assignment]
    repeats = []
    for repeat_texts in per_repeat:
        bench = {"completed": 3, "failed": 0, "total_input_tokens": 30, "duration": 1.0, "median_ttft_ms": 1.0}
        if repeat_texts is not None:
            bench["generated_texts"] = repeat_texts
        repeats.append(Repeat(bench, None, None, None, "r.json", "python -m pytest_apc.measure.bench ..."))
    server = ServerInfo(f"apc-{'on' if key.apc else 'off'}", list(command), "http://h:1", "log")
    server.kv_cache_line = kv_cache_line
    workload = Workload(key.family, 4, 4, 4, 3, 0)
    return RunRecord(key, workload, server, repeats, 26, 1.0, probes=probes, probe_error=error)


def healthy_pair(settings) -> Pair:
    good = [answer([1, 2, 3]), answer([4, 5, 6])]
    on = run("D", [Probe(i, a, a) for i, a in enumerate(good)], texts=["x", "y", "z"])
    off = run("C", [Probe(i, a) for i, a in enumerate(good)], texts=["x", "y", "q"])
    return Pair(off, on, settings)


@pytest.fixture
def cpu_settings(pytester: pytest.Pytester):
    from pytest_apc import config

    return config.resolve(pytester.parseconfig("--cpu-node"), environ={})


def test_a_healthy_pair_passes_and_reports_the_benchmarks_own_texts(cpu_settings) -> None:
    found = answers.same_answers(healthy_pair(cpu_settings))
    assert found.passed, found.message
    assert found.numbers["cached_vs_uncached"] == {"identical": 2, "near tie": 0, "differ": 0}
    assert found.numbers["cached_vs_twin"]["identical"] == 2
    assert found.numbers["benchmark_identical"] == (2, 3)
    assert "every request under load against C-c8's: 2/3 identical (reported: the build is not known" in found.message


def test_a_cache_that_serves_other_content_fails_with_both_texts_and_the_commands(cpu_settings) -> None:
    pair = healthy_pair(cpu_settings)
    pair.on.probes[1] = Probe(1, answer([4, 5, 6]), answer([4, 9, 9]))
    found = answers.same_answers(pair)
    assert not found.passed
    assert "request 1: parts at token 1 (9 vs 5)" in found.message
    assert "'4 9 9'" in found.message
    assert "'4 5 6'" in found.message
    assert "apc-on server: vllm serve m" in found.message
    assert "apc-off server: vllm serve m" in found.message
    assert "curl -s http://h:1/v1/chat/completions" in found.message
    assert found.numbers["first_divergence"]["position"] == 1
    assert answers.compared(pair.on, pair.off).cell == "2 DIFFER"


def test_no_probe_is_a_failure_not_a_pass(cpu_settings) -> None:
    on = run("D", [], error="probe request answered HTTP 400: cache_salt is not supported")
    found = answers.same_answers(on)
    assert not found.passed
    assert "HTTP 400" in found.message
    assert answers.compared(on).cell == "error"
    empty = answers.same_answers(run("D", []))
    assert not empty.passed
    assert "no cached answer was probed" in empty.message


def test_probes_survive_the_results_file_and_the_store() -> None:
    record = run("D", [Probe(3, answer([1, 2]), answer([1, 2]), prompt_chars=99)], texts=["a"])
    back = RunRecord.from_json(json.loads(json.dumps(record.to_json())))
    assert back.probes == record.probes
    measured = Measured(records={record.key: record})
    state = json.loads(json.dumps(measured.to_state()))
    assert Measured.from_state(state).records[record.key].probes == record.probes


EXACT = {
    "command": ("vllm", "serve", "m", "--dtype", "float32"),
    "kv_cache_line": "CPU KV cache size: 2,097,152 tokens",
}


def exact_pair(settings, on_texts: list[list[str]], off_texts: list[list[str]], **server) -> Pair:
    """A pair on an exact build (vLLM's CPU build serving float32) whose probes all agree."""
    good = [answer([1, 2, 3])]
    kind = server or EXACT
    on = run("D", [Probe(0, good[0], good[0])], texts=on_texts, **kind)
    off = run("C", [Probe(0, good[0])], texts=off_texts, **kind)
    return Pair(off, on, settings)


def test_the_dtype_a_command_asks_for() -> None:
    from pytest_apc.measure.answers import server_dtype

    assert server_dtype(["vllm", "--dtype", "bfloat16", "--dtype=float32"]) == "float32"
    assert server_dtype(["vllm", "--model", "m"]) is None


def test_only_cpu_float32_on_both_servers_is_exact(cpu_settings) -> None:
    pair = exact_pair(cpu_settings, [["a"]], [["a"]])
    assert answers.exact_build(pair.on, pair.off) == "vLLM's CPU build serving float32"
    bf16 = exact_pair(cpu_settings, [["a"]], [["a"]], command=("vllm",), kv_cache_line=EXACT["kv_cache_line"])
    assert answers.exact_build(bf16.on, bf16.off) is None
    gpu = exact_pair(cpu_settings, [["a"]], [["a"]], command=EXACT["command"], kv_cache_line="GPU KV cache size: 9")
    assert answers.exact_build(gpu.on, gpu.off) is None


def test_on_an_exact_build_every_request_of_every_repeat_must_be_identical(cpu_settings) -> None:
    """A cache that goes wrong only under load answers the probe (sent alone) right: the requests of the run
    itself show it. The failure names each request that parts, where, and both texts."""
    off = [["alpha", "beta", "gamma"], ["alpha", "beta", "gamma"]]
    on = [["alpha", "beta", "gamma"], ["alpha", "betX wrong", "gamma"]]
    found = answers.same_answers(exact_pair(cpu_settings, on, off))
    assert not found.passed
    assert "every request under load against C-c8's: 5/6 identical (judged: vLLM's CPU build serving float32" in (
        found.message
    )
    assert "repeat 2, request 1: parts at character 3" in found.message
    assert "'betX wrong'" in found.message
    assert "'beta'" in found.message
    assert "only under load" in found.message
    assert "reproduce:" in found.message
    assert found.numbers["answers"] == "1 DIFFER"
    assert found.numbers["exact"] == "vLLM's CPU build serving float32"
    requests = found.numbers["requests"]
    assert len(requests) == 6
    assert sum(not r["identical"] for r in requests) == 1
    assert requests[4] == {"repeat": 1, "index": 1, "identical": False, "position": 3, "texts": ["betX wrong", "beta"]}


def test_on_an_exact_build_a_healthy_pair_passes_and_counts_every_request(cpu_settings) -> None:
    texts = [["alpha", "beta", "gamma"], ["alpha", "beta", "gamma"]]
    found = answers.same_answers(exact_pair(cpu_settings, texts, texts))
    assert found.passed, found.message
    assert found.numbers["answers"] == "6/6"
    pair = exact_pair(cpu_settings, texts, texts)
    assert answers.compared(pair.on, pair.off).cell == "6/6"


def test_elsewhere_requests_under_load_are_reported_not_judged(cpu_settings) -> None:
    """On a build not known to be exact, two correct servers' texts part at near ties under load: reported."""
    pair = exact_pair(cpu_settings, [["alpha", "bet"]], [["alpha", "beta"]], command=("vllm",), kv_cache_line=None)
    found = answers.same_answers(pair)
    assert found.passed, found.message
    assert "1/2 identical (reported" in found.message
    assert found.numbers["answers"] == "2/2"  # the probe: its own uncached answer and the twin's, judged there


GPU = {"command": ("vllm", "serve", "m"), "kv_cache_line": "GPU KV cache size: 936,736 tokens"}


def salted_repeat(texts: list[str], hits: int | None = 0) -> Repeat:
    """A salted reference run: its benchmark's texts and the hits its counters saw."""
    bench = {"completed": len(texts), "failed": 0, "total_input_tokens": 30, "duration": 1.0, "median_ttft_ms": 1.0}
    delta = None if hits is None else metrics.Delta(1000, hits, 1000, 1000 - hits, hits, None, 0, {})
    salted = "python -m pytest_apc.measure.bench ... --cache-salt-per-request pytest-apc-D-c8-1"
    return Repeat({**bench, "generated_texts": texts}, delta, None, None, "s.json", salted)


def invariant_pair(settings, on_texts: list[list[str]], salted: Repeat, twin_probe: Answer | None = None) -> Pair:
    """A GPU pair whose APC-on server runs in vLLM's batch-invariant mode, with a salted reference; the twin's
    probed answer may part from the APC-on server's (two correct servers part there even in that mode)."""
    good = answer([1, 2, 3])
    on = run("D", [Probe(0, good, good)], texts=on_texts, **GPU)
    on.server.batch_invariant = True
    on.salted = salted
    off = run("C", [Probe(0, twin_probe or good)], texts=[["other"] * len(on_texts[0])], **GPU)
    return Pair(off, on, settings)


def test_in_batch_invariant_mode_every_request_is_judged_against_its_salted_reference(cpu_settings) -> None:
    """A GPU in batch-invariant mode gives the same tokens cached or not, alone or under load, on one server:
    a request that parts from its salted reference fails, named; the APC-off twin (which parts from the
    APC-on server even in that mode) is reported, not judged."""
    on = [["alpha", "beta", "gamma"], ["alpha", "betX wrong", "gamma"]]
    found = answers.same_answers(invariant_pair(cpu_settings, on, salted_repeat(["alpha", "beta", "gamma"])))
    assert not found.passed
    assert "every request under load against its salted reference's (each request with a cache_salt of its own, " in (
        found.message
    )
    assert "5/6 identical (judged: vLLM's batch-invariant mode (VLLM_BATCH_INVARIANT=1)" in found.message
    assert "repeat 2, request 1: parts at character 3" in found.message
    assert "its salted reference (each request with a cache_salt of its own): python -m pytest_apc" in found.message
    assert found.numbers["reference"] == "salted"
    assert found.numbers["answers"] == "1 DIFFER"


def test_in_batch_invariant_mode_a_twin_that_parts_at_a_token_outside_the_top_k_is_reported(cpu_settings) -> None:
    texts = [["alpha", "beta"]]
    pair = invariant_pair(cpu_settings, texts, salted_repeat(["alpha", "beta"]), twin_probe=answer([1, 9, 9]))
    found = answers.same_answers(pair)
    assert found.passed, found.message
    reported = "(reported: every request is judged against its salted reference): 0 identical, 0 near ties, 1 differ"
    assert reported in found.message
    assert found.numbers["answers"] == "2/2"
    without_mode = invariant_pair(cpu_settings, texts, salted_repeat(["alpha", "beta"]), twin_probe=answer([1, 9, 9]))
    without_mode.on.server.batch_invariant = False
    assert not answers.same_answers(without_mode).passed  # not exact: the probe's rule judges the twin too


def test_a_salted_reference_that_hit_the_cache_or_was_not_counted_is_no_reference(cpu_settings) -> None:
    hit = answers.same_answers(invariant_pair(cpu_settings, [["a"]], salted_repeat(["a"], hits=256)))
    assert not hit.passed
    assert "its salted reference hit 256 cached tokens of 1000" in hit.message
    assert "answers_reference=twin" in hit.message
    blind = answers.same_answers(invariant_pair(cpu_settings, [["a"]], salted_repeat(["a"], hits=None)))
    assert not blind.passed
    assert "cannot verify that its salted reference was computed without the cache" in blind.message


def test_the_salted_reference_survives_the_store_and_the_results_file_keeps_its_hits() -> None:
    record = run("D", [], texts=["a"])
    record.salted = salted_repeat(["a"])
    record.repeats[0].answers, record.salted.answers = [answer([1, 2])], [answer([1, 3])]
    state = json.loads(json.dumps(Measured(records={record.key: record}).to_state()))
    back = Measured.from_state(state).records[record.key]
    assert (back.salted, back.repeats[0].answers) == (record.salted, [answer([1, 2])])
    kept = record.to_json()["answers"]["salted"]
    assert kept["prefix_cache_hits"] == 0
    assert kept["command"].endswith("--cache-salt-per-request pytest-apc-D-c8-1")


def test_which_runs_get_a_salted_reference(cpu_settings) -> None:
    from dataclasses import replace

    from pytest_apc.measure.run import wants_salted

    server = ServerInfo("apc-on", [], "", "")
    cpu = ServerInfo("apc-on", list(EXACT["command"]), "", "", kv_cache_line=EXACT["kv_cache_line"])
    invariant = ServerInfo("apc-on", [], "", "", batch_invariant=True)
    on, off, turns = RunKey("D", 8), RunKey("C", 8), RunKey("M", 1)
    assert not wants_salted(on, cpu_settings, cpu)  # auto: the CPU float32 twin is the exact reference
    assert wants_salted(on, cpu_settings, invariant)
    no_logprobs = replace(cpu_settings, answers_logprobs="off")
    for twinless in (RunKey("R", 8, route="round_robin"), RunKey("D", 8, "xxhash")):
        assert wants_salted(twinless, cpu_settings, cpu)  # no twin: the salted reference, where exact
        assert wants_salted(twinless, cpu_settings, server)  # not known to be exact: judged on logprobs
        assert not wants_salted(twinless, no_logprobs, server)  # ... unless they are off: the probe alone
    # Not known to be exact: every request judged on its logprobs against the same server's salted run (two
    # servers' uncached answers part outside each other's top-k there); without logprobs the twin, reported.
    assert wants_salted(on, cpu_settings, server)
    assert not wants_salted(on, no_logprobs, server)
    assert not wants_salted(off, cpu_settings, invariant)  # APC off: nothing to judge
    salted = replace(cpu_settings, answers_reference="salted")
    assert wants_salted(on, salted, server)
    assert not wants_salted(turns, salted, server)  # multi-turn runs are probed only
    assert not wants_salted(on, replace(cpu_settings, answers_reference="twin"), invariant)
    eager = ServerInfo("apc-on", ["vllm", "--enforce-eager"], "", "", batch_invariant=True)
    assert wants_salted(on, cpu_settings, eager)  # eager is not exact with itself: judged on logprobs
    assert not wants_salted(on, no_logprobs, eager)  # ... or without them the twin, reported


def test_which_runs_keep_their_logprobs(cpu_settings) -> None:
    """Where the build is not known to be exact, both runs of a pair (the same work for the timing) keep
    every request's tokens with top-k logprobs; on an exact build none do; multi-turn runs never."""
    from dataclasses import replace

    from pytest_apc.measure.run import wants_logprobs

    server = ServerInfo("apc-on", [], "", "")
    cpu = ServerInfo("apc-on", list(EXACT["command"]), "", "", kv_cache_line=EXACT["kv_cache_line"])
    invariant = ServerInfo("apc-on", [], "", "", batch_invariant=True)
    for key in (RunKey("D", 8), RunKey("C", 8), RunKey("R", 8, route="round_robin")):
        assert wants_logprobs(key, cpu_settings, server)
        assert not wants_logprobs(key, cpu_settings, cpu)
        assert not wants_logprobs(key, cpu_settings, invariant)
        assert not wants_logprobs(key, replace(cpu_settings, answers_logprobs="off"), server)
        assert wants_logprobs(key, replace(cpu_settings, answers_logprobs="on"), cpu)
    assert not wants_logprobs(RunKey("M", 1), replace(cpu_settings, answers_logprobs="on"), server)


def test_which_runs_are_probed(pytester: pytest.Pytester, cpu_settings) -> None:
    """The probe, sent alone after the run, could only agree where every request under load is judged
    against a reference the build computes exactly: it is skipped there, unless answers_probes is given."""
    from pytest_apc import config
    from pytest_apc.measure.run import wants_probe

    cpu = ServerInfo("apc-on", list(EXACT["command"]), "", "", kv_cache_line=EXACT["kv_cache_line"])
    bf16 = ServerInfo("apc-on", ["vllm"], "", "", kv_cache_line=EXACT["kv_cache_line"])
    invariant = ServerInfo("apc-on", [], "", "", batch_invariant=True)
    gpu = ServerInfo("apc-on", [], "", "")
    on, off, route = RunKey("D", 8), RunKey("C", 8), RunKey("R", 8, route="round_robin")
    assert not wants_probe(on, cpu_settings, cpu, salted=False)  # its exact twin judges every request
    assert not wants_probe(off, cpu_settings, cpu, salted=False)  # nor the twin itself
    assert not wants_probe(off, cpu_settings, invariant, salted=False)  # its APC-on twin has a salted reference
    assert wants_probe(off, cpu_settings, gpu, salted=False)  # its uncached answers are the twin's reference
    assert not wants_probe(route, cpu_settings, cpu, salted=True)  # its salted reference does
    assert not wants_probe(on, cpu_settings, invariant, salted=True)
    assert wants_probe(on, cpu_settings, bf16, salted=False)  # not exact: the probe's rule judges
    assert wants_probe(on, cpu_settings, gpu, salted=False)
    assert wants_probe(route, cpu_settings, cpu, salted=False)  # answers_reference=twin and no twin
    given = config.resolve(pytester.parseconfig("--cpu-node", "--apc-set", "answers_probes=4"), environ={})
    assert given.given("answers_probes")
    assert not cpu_settings.given("answers_probes")
    assert wants_probe(on, given, cpu, salted=False)


def test_an_exact_build_without_a_probe_is_judged_by_its_requests(cpu_settings) -> None:
    texts = [["alpha", "beta", "gamma"]]
    pair = exact_pair(cpu_settings, texts, texts)
    pair.on.probes, pair.off.probes = [], []
    found = answers.same_answers(pair)
    assert found.passed, found.message
    assert found.numbers["answers"] == "3/3"
    assert "D-c8: no probe (every request is judged exactly; --apc-set answers_probes=N sends N)" in found.message
    pair.on.repeats[0].bench["generated_texts"] = ["alpha", "betX", "gamma"]
    assert not answers.same_answers(pair).passed
    del pair.on.repeats[0].bench["generated_texts"]  # no texts and no probe: nothing was compared
    assert "no cached answer was probed" in answers.same_answers(pair).message


def test_batch_invariant_mode_run_eagerly_is_not_judged_exact(cpu_settings) -> None:
    """On a GPU in batch-invariant mode with --enforce-eager, cached and uncached answers of one server part
    at near ties: a request that parts from its salted reference there is reported, and the probe's rule
    judges."""
    from pytest_apc.measure.answers import enforce_eager

    assert enforce_eager(["vllm", "--enforce-eager"])
    assert not enforce_eager(["vllm", "--enforce-eager", "--no-enforce-eager"])
    assert not enforce_eager(["vllm", "--enforce-eager=false"])
    texts = [["alpha", "beta"], ["alpha", "betX"]]
    pair = invariant_pair(cpu_settings, texts, salted_repeat(["alpha", "beta"]))
    pair.on.server.command = ["vllm", "--enforce-eager"]
    found = answers.same_answers(pair)
    assert found.passed, found.message
    assert "3/4 identical (reported: the build is not known to be exact" in found.message


def test_batch_invariant_mode_is_asked_for_in_the_launched_servers_environment(cpu_settings, tmp_path) -> None:
    """``--apc-set batch_invariant=on`` starts the servers with VLLM_BATCH_INVARIANT=1, and the server's
    record says so (the verdict reads it); vLLM reads the variable as an integer."""
    from dataclasses import replace

    from pytest_apc.serving.deployment import launched_server
    from pytest_apc.serving.endpoint import Reach
    from pytest_apc.serving.launch_env import batch_invariant
    from pytest_apc.workload.cases import ServerMode

    assert batch_invariant({"VLLM_BATCH_INVARIANT": "1"})
    assert not batch_invariant({"VLLM_BATCH_INVARIANT": "0"})
    assert not batch_invariant({"VLLM_BATCH_INVARIANT": "yes"})
    assert not batch_invariant({})
    how = Reach("m", tmp_path / "server.log", 10.0)
    mode = ServerMode(apc=True)
    for asked, expected in (("on", True), ("off", False)):
        settings = replace(cpu_settings, batch_invariant=asked)
        server = launched_server(mode, settings, "/models/m", how, tensor_parallel=1)
        assert (server.env.get("VLLM_BATCH_INVARIANT") == "1") is expected
        server._command(8000)
        assert server.info.batch_invariant is expected


def logprob_pair(settings, on_answers: list[Answer], salted_answers: list[Answer]) -> Pair:
    """A GPU pair in vLLM's default kernels (not exact) whose requests kept their tokens with top-k logprobs:
    the APC-on run's against its salted reference's."""
    on = run("D", [], texts=[[a.text for a in on_answers]], **GPU)
    on.repeats[0].answers = on_answers
    on.salted = salted_repeat([a.text for a in salted_answers])
    on.salted.answers = salted_answers
    off = run("C", [], texts=[["other"] * len(on_answers)], **GPU)
    return Pair(off, on, settings)


def test_where_the_build_is_not_exact_each_request_is_judged_on_its_logprobs(cpu_settings) -> None:
    """Two correct answers may part at a near tie (each one's token among the other's top-k): they agree;
    an answer that parts at a token its reference did not consider fails, named with the token and both
    texts; identical texts are not enough, the tokens are what is judged."""
    tie_a = Answer([1, 2, 3], "one two three", [{1: -0.1}, {2: -0.70, 7: -0.71}, {3: -0.1}])
    tie_b = Answer([1, 7, 9], "one seven nine", [{1: -0.1}, {7: -0.69, 2: -0.70}, {9: -0.1}])
    healthy = logprob_pair(cpu_settings, [answer([4, 5]), tie_a], [answer([4, 5]), tie_b])
    found = answers.same_answers(healthy)
    assert found.passed, found.message
    assert "1/2 identical, 2/2 agreeing (judged per request on its top-k logprobs" in found.message
    assert found.numbers["answers"] == "2/2"
    kept = found.numbers["requests"][1]
    assert kept["tokens"]["outcome"] == answers.NEAR_TIE
    assert kept["tokens"]["position"] == 1
    assert kept["drift_nats"] == pytest.approx(0.0)

    wrong = logprob_pair(cpu_settings, [answer([4, 5]), answer([1, 2, 3])], [answer([4, 5]), answer([1, 8, 3])])
    found = answers.same_answers(wrong)
    assert not found.passed
    assert found.numbers["answers"] == "1 DIFFER"
    assert "repeat 1, request 1: parts at token 1 (differ, outside each other's top-k)" in found.message
    assert "'1 2 3'" in found.message
    assert "'1 8 3'" in found.message
    assert "under load, answers part at tokens outside each other's top-k" in found.message
    assert found.numbers["requests"][1]["tokens"]["tokens"] == [2, 8]


def test_without_logprobs_on_every_request_a_build_not_exact_reports_its_requests(cpu_settings) -> None:
    """A request whose answer was not kept cannot be judged: the requests are reported, as before."""
    pair = logprob_pair(cpu_settings, [answer([4, 5])], [answer([4, 6])])
    pair.on.salted.answers = None
    found = answers.compared(pair.on, pair.off)
    assert not found.by_logprobs
    assert not found.requests_judged


def test_an_answer_is_judged_on_its_first_tokens() -> None:
    """Two answers that agree on their first tokens and part later, outside each other's top-k, agree within
    a window that ends before the parting; the text stays whole."""
    a = Answer([1, 2, 3, 4], "one two three four", [{1: -0.1}, {2: -0.1}, {3: -0.1}, {4: -0.1}])
    b = Answer([1, 2, 3, 9], "one two three nine", [{1: -0.1}, {2: -0.1}, {3: -0.1}, {9: -0.1}])
    assert answers.compare(0, a, b).outcome == answers.DIFFER
    assert answers.compare(0, a.first(3), b.first(3)).outcome == answers.IDENTICAL
    assert a.first(3) == Answer([1, 2, 3], "one two three four", [{1: -0.1}, {2: -0.1}, {3: -0.1}])
    assert a.first(10) == a


def test_a_shared_tokens_logprob_drift_is_reported() -> None:
    a = Answer([1, 2, 3], "a", [{1: -0.5}, {2: -0.2}, {3: -1.0}])
    b = Answer([1, 2, 4], "b", [{1: -0.8}, {2: -0.25}, {4: -0.1}])
    assert answers.drift(a, b, 2) == pytest.approx(0.3)
    assert answers.drift(a, b, 1) == pytest.approx(0.3)
    assert answers.drift(a, a, 3) == 0.0
