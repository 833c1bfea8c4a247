"""Run contenders alternately, repeat, and print medians and ratios to tfdistx.

Alternating (A B C A B C ...) rather than A A A B B B spreads the noise of a
shared machine over all contenders; the 1-minute load average is printed so
a reader can judge how quiet the run was.
"""

import os
import statistics
import sys
from typing import Callable, Dict


def compare(contenders: Dict[str, Callable[[], float]], repeats: int, title: str, ours: str = "tfdistx") -> Dict[str, float]:
    """Print each contender's median and tfdistx's speed relative to it; returns the medians."""
    return table(contenders, repeats, title, f"{ours} / it", lambda medians, name: medians[ours] / medians[name])


def table(contenders: Dict[str, Callable[[], float]], repeats: int, title: str, ratio_name: str,
          ratio: Callable[[Dict[str, float], str], float], unit: str = "examples/s") -> Dict[str, float]:
    samples = {name: [] for name in contenders}
    load_before = os.getloadavg()[0]
    for repeat in range(repeats):
        for name, run in contenders.items():
            samples[name].append(run())
            print(f"  repeat {repeat + 1}: {name}: {samples[name][-1]:,.2f} {unit}", file=sys.stderr, flush=True)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    print(f"{title}, median of {repeats} (1-min load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after)")
    print(f"{'contender':<42}{unit:>12}{ratio_name:>16}")
    for name, value in medians.items():
        print(f"{name:<42}{value:>12,.2f}{ratio(medians, name):>15.2f}x")
    return medians
