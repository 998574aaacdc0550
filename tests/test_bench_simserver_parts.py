"""The simulated server's parts, each by itself (gpubox/simbox/simserver_*.py): the speculative
acceptance model, a reply's SSE chunks, and the truth record of a streamed request."""

import json
import random

from gpubox.simbox import simserver
from gpubox.simbox.simserver_generation import Reply, Sim
from gpubox.simbox.simserver_rates import accept_prob
from gpubox.simbox.simserver_truth import record


def test_acceptance_probability_gives_the_mean_accepted_length():
    for mean, budget in ((4.0, 15), (6.5, 15), (7.6, 64)):
        p = accept_prob(mean, budget)
        assert abs(sum(p**i for i in range(1, budget + 1)) - (mean - 1)) < 1e-6


def _reply(chat: bool) -> Reply:
    return Reply(
        chat=chat,
        cid="chatcmpl-sim00000001" if chat else "cmpl-sim00000001",
        created=1,
        model="m",
        user="u",
        t_recv=10.0,
        prompt_tokens=3,
        max_tokens=5,
        n_target=5,
        stream=True,
        usage_on=True,
        thinking=False,
        rng=random.Random(0),
        stall_rng=random.Random(1),
    )


def _event(chunk: bytes) -> dict:
    size, _, rest = chunk.partition(b"\r\n")
    body = rest[: int(size, 16)]
    assert body.startswith(b"data: ") and body.endswith(b"\n\n")
    return json.loads(body[len(b"data: ") :])


def test_chunks_are_shaped_as_vllm_sends_them():
    chat = _event(_reply(True).chunk(" tok", "length"))
    assert chat["object"] == "chat.completion.chunk" and chat["choices"][0]["delta"] == {"content": " tok"}
    assert chat["choices"][0]["finish_reason"] == "length"
    text = _event(_reply(False).chunk(" tok tok"))
    assert text["object"] == "text_completion" and text["choices"][0]["text"] == " tok tok"
    usage = _event(_reply(False).chunk(None, usage=_reply(False).usage(5)))
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 5,
        "total_tokens": 8,
    }


def test_truth_record_is_kept_and_appended_to_the_truth_file(tmp_path):
    truth = tmp_path / "truth.jsonl"
    a = simserver.parse(["--truth-file", str(truth), "--tp", "4", "--method", "ddtree"])
    sim = Sim(a)
    stamps = {
        "t_first": 10.5,
        "t_first_written": 10.6,
        "t_last": 12.0,
        "t_last_written": 12.1,
        "t_end_written": 12.2,
    }
    record(sim, _reply(True), stamps, 5, plan_first=10.4, plan_last=11.9)
    rec = sim.truth[-1]
    assert rec["ttft_s"] == 0.5 and rec["e2e_s"] == 2.0 and rec["output_tokens"] == 5
    assert abs(rec["plan_ttft_s"] - 0.4) < 1e-9 and abs(rec["plan_e2e_s"] - 1.9) < 1e-9
    line = json.loads(truth.read_text())
    assert line == {**rec, "tp": 4, "method": "ddtree"}
