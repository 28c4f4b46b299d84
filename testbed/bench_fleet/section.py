"""The fleet section: every size measured, smallest first, then the largest profiled."""

from __future__ import annotations

import json
from pathlib import Path

from testbed.bench_fleet.measure import SizeResult, fleet_key, measure_size
from testbed.bench_fleet.profiling import Profile, profile_largest, profile_largest_up, profile_noop_up, state_parts
from testbed.e2e.run import Run


def fleet(program: Run, bare: Run, sizes: list[tuple[int, int]], runs: int, work: Path,
          *, profile: bool, replay: Run | None = None) -> tuple[list[SizeResult], Profile | None]:
    """Every size, smallest first; then where the largest size's time and state go."""
    key = fleet_key(work)
    rows = []
    for nodes, models in sizes:
        print(f"fleet {nodes}x{models}: preview, up, no-op up, {runs} runs each", flush=True)
        rows.append(measure_size(nodes, models, program, bare, runs, key, work, warm_up=not rows, replay=replay))
    found = None
    if profile:
        nodes, models = sizes[-1]
        name = f"fleet-{nodes}x{models}"
        # Preview dials no node: the stand-in the stacks name is gone by now, and not needed.
        found = profile_largest(program, bare, f"{name}-preview", f"{name}-bare-preview", work / name)
        found.engine = profile_largest_up(program, nodes, models, key, work / name)
        last = runs - 1  # the stacks of the last first `up`, measured as the table's state
        found.noop = profile_noop_up(program, bare, f"{name}-{last}", f"{name}-bare-{last}", work / name)
        found.state = state_parts({side: json.loads(run.pulumi("stack", "export", stack=stack, timeout=600).stdout)
                                   for side, run, stack in (("ours", program, f"{name}-{last}"), ("bare", bare, f"{name}-bare-{last}"))})
    return rows, found
