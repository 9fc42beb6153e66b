"""Summary of an nvidia-smi clock log taken while benchmarks ran (tests/device_check.sh), so a
table's numbers come with the clocks they ran at: the H200 holds 1980 MHz until its 700 W cap,
then drops to ~1400 MHz under sustained GEMMs (bench/NOTES.md v0.5).
Log: nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active
     --format=csv,noheader -lms 500 > clocks.csv
Usage: python bench/clocks.py clocks.csv"""
import statistics
import sys

SW_POWER_CAP = 0x4  # nvmlClocksThrottleReasonSwPowerCap


def summarize(lines) -> str:
    clocks, watts, capped = [], [], 0
    for line in lines:  # fields told apart by their units: the first MHz is the SM clock
        fields = [f.strip() for f in line.split(",")]
        mhz = next((f for f in fields if f.endswith(" MHz")), None)
        w = next((f for f in fields if f.endswith(" W")), None)
        reasons = next((f for f in fields if f.startswith("0x")), None)
        if mhz is None or w is None or reasons is None:
            continue  # a header or a truncated last line
        try:
            sample = float(mhz.split()[0]), float(w.split()[0]), int(reasons, 16)
        except ValueError:
            continue
        clocks.append(sample[0])
        watts.append(sample[1])
        capped += bool(sample[2] & SW_POWER_CAP)
    if not clocks:
        return "GPU clocks during the benchmarks: no samples"
    return (f"GPU clocks during the benchmarks: {len(clocks)} samples; SM clock min / median / max "
            f"{min(clocks):.0f} / {statistics.median(clocks):.0f} / {max(clocks):.0f} MHz; power "
            f"median / max {statistics.median(watts):.0f} / {max(watts):.0f} W; power-capped in "
            f"{100 * capped / len(clocks):.0f}% of samples")


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(summarize(f))
