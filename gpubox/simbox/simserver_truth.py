"""The simulated server's truth records: for each streamed request, when its tokens really left
(stamped at the socket write) and when the simulator meant to send them, kept for /sim/truth and
appended to --truth-file as JSON lines. Tests compare a client's measurements against these.
"""

from __future__ import annotations

import json

from .simserver_generation import Reply, Sim


def record(
    sim: Sim, r: Reply, stamps: dict[str, float], emitted: int, plan_first: float, plan_last: float
) -> None:
    """The server's truth for one streamed request: when each token really left, and when
    the simulator meant to send the first and last one. Sent later than planned = the
    machine could not keep the pace (load), which tests measure instead of assuming a margin."""
    s, a = sim, sim.a
    s.truth.append(
        {
            "id": r.cid,
            "user": r.user,
            "t_recv": r.t_recv,
            "t_first": stamps["t_first"],
            "t_last": stamps["t_last"],
            "t_first_written": stamps["t_first_written"],
            "t_last_written": stamps["t_last_written"],
            "t_end_written": stamps["t_end_written"],
            "ttft_s": stamps["t_first"] - r.t_recv,
            "e2e_s": stamps["t_last"] - r.t_recv,
            "output_tokens": emitted,
            "prompt_tokens": r.prompt_tokens,
            "plan_ttft_s": plan_first - r.t_recv,
            "plan_e2e_s": plan_last - r.t_recv,
        }
    )
    if a.truth_file:
        with open(a.truth_file, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({**s.truth[-1], "tp": a.tp, "method": a.method}) + "\n")
