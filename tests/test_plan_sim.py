"""bench/plan_sim.py: the call model's placement, latencies and queue on small made-up plans."""
import importlib.util
import os
import sys

_path = os.path.join(os.path.dirname(__file__), "..", "bench", "plan_sim.py")
_spec = importlib.util.spec_from_file_location("plan_sim", _path)
plan_sim = importlib.util.module_from_spec(_spec)
sys.modules["plan_sim"] = plan_sim  # (its dataclass looks its module up while it is created)
_spec.loader.exec_module(plan_sim)
Launch = plan_sim.Launch


def test_static_and_claimed_tiles_and_stream_latencies():
    a = Launch("a", "main", [10.0] * 6, 4)  # static: CTAs 0, 1 take two tiles, 2, 3 one
    b = Launch("b", "main", [5.0] * 4, 4)   # after a on its stream: a programmatic start
    c = Launch("c", "side", [1.0] * 4, 4, after=["a"])  # after a from the other stream
    span, idle, spans = plan_sim.launches([a, b, c], sms=8)  # (c finds SMs b leaves free)
    assert spans["a"] == (0.0, 20.0)
    assert spans["b"][0] == 20.0 + plan_sim.PDL_US
    assert spans["c"][0] == 20.0 + plan_sim.CROSS_US
    claimed = Launch("a", "main", [10.0] * 6, 4, claims=True)
    assert plan_sim.launches([claimed], sms=4)[0] == 20.0  # 6 tiles on 4 CTAs: two rounds either way
    # idle: what the SMs did not run within the span
    assert span == spans["b"][1] == 20.0 + plan_sim.PDL_US + 5.0
    assert abs(idle - (8 * span - (60 + 20 + 4))) < 1e-9
    blocked = plan_sim.launches([a, b, c], sms=4)[2]
    assert blocked["c"][0] == blocked["b"][1]  # no SM free for c until b's CTAs leave


def test_shared_blocks_fill_their_sms():
    r = Launch("r", "side", [8.0] * 16, 2, per_sm=8)  # 16 blocks, 8 at a time on each of 2 SMs
    span, _, spans = plan_sim.launches([r], sms=4)
    assert span == 8.0 and spans["r"] == (0.0, 8.0)


def test_queue_waits_for_dependencies_in_order():
    span, idle = plan_sim.queue([10.0, 1.0, 1.0], {1: [0]}, sms=2)  # tile 1 waits for 0; 2 takes the free SM
    assert span == 11.0 and abs(idle - (2 * 11.0 - 12.0)) < 1e-9
