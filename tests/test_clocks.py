"""bench/clocks.py: the clock log summary device_check.sh appends to the benchmark tables."""
import importlib.util
import os

_path = os.path.join(os.path.dirname(__file__), "..", "bench", "clocks.py")
_spec = importlib.util.spec_from_file_location("clocks", _path)
clocks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(clocks)


def test_summary_reads_fields_by_unit_and_counts_power_capped_samples():
    log = ["timestamp, clocks.current.sm [MHz], power.draw [W], clocks_event_reasons.active",
           "2026/11/29 12:19:04.384, 1980 MHz, 126.56 W, 0x0000000000000000",
           "2026/11/29 12:19:11.644, 1410 MHz, 3201 MHz, 705.43 W, 50, 0x0000000000000004",
           "2026/11/29 12:19:11.894, 1395 MHz, 696.98 W, 0x0000000000000004",
           "2026/11/29 12:19:12.1"]  # a last line cut short when the logger was killed
    got = clocks.summarize(log)
    assert "3 samples" in got and "1395 / 1410 / 1980 MHz" in got
    assert "697 / 705 W" in got and "power-capped in 67% of samples" in got


def test_no_samples():
    assert clocks.summarize(["timestamp, clocks.current.sm [MHz]"]).endswith("no samples")
