"""Timing: interleaved rounds, so that a drift of the (shared) machine favours no one."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

from contenders import Contender
from servers import log


@dataclass
class Samples:
    """Cycles/s of one contender, one sample per round, and its process CPU per cycle."""

    contender: Contender
    rates: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.rates)


def cycles_per_second(contender: Contender, seconds: float) -> tuple[float, float]:
    """Run the cycle back to back for ``seconds``: cycles/s and process CPU us per cycle.

    The CPU time is the whole process's (a heartbeat or a renewal thread included).
    """
    op, done = contender.op, 0
    cpu, start = time.process_time(), time.perf_counter()
    deadline = start + seconds
    while True:
        op()
        done += 1
        now = time.perf_counter()
        if now >= deadline:
            return done / (now - start), (time.process_time() - cpu) * 1e6 / done


def rounds(contenders: list[Contender], seconds: float, repeat: int) -> dict[str, Samples]:
    """Every contender once per round, in an order that rotates each round.

    One warm-up sample of each is thrown away first.
    """
    for contender in contenders:
        cycles_per_second(contender, seconds / 2)
    out = {c.name: Samples(c) for c in contenders}
    for number in range(repeat):
        shift = number % len(contenders)
        for contender in contenders[shift:] + contenders[:shift]:
            rate, cpu = cycles_per_second(contender, seconds)
            out[contender.name].rates.append(rate)
            out[contender.name].cpu_us.append(cpu)
    group = contenders[0].group
    log(f"  {group}: " + ", ".join(f"{n} {s.median:,.0f}/s" for n, s in out.items()))
    return out


def ratio(samples: dict[str, Samples], ours: str, other: str) -> float | None:
    """Median over rounds of ours / other (cycles/s, wall), both measured in the same round."""
    if ours not in samples or other not in samples:
        return None
    pairs = zip(samples[ours].rates, samples[other].rates, strict=True)
    return round(statistics.median(a / b for a, b in pairs), 3)


def cpu_ratio(samples: dict[str, Samples], ours: str, other: str) -> float | None:
    """Median over rounds of other's CPU per cycle / ours: cycles per CPU second, ours / other.

    Read like :func:`ratio` (1.0: as cheap; 0.5: twice the CPU), but hardly
    moved by other processes: a loaded machine delays a cycle, it does not
    make it cost more CPU.
    """
    if ours not in samples or other not in samples:
        return None
    pairs = zip(samples[ours].cpu_us, samples[other].cpu_us, strict=True)
    return round(statistics.median(b / a for a, b in pairs), 3)


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by the nearest-rank method."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
