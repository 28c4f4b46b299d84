"""The fleet-scale section of `make bench-engine`: generated stacks up to 32 nodes and 100 models on the
real engine, each against a bare program of the same resources and providers, measured in one run.

For each size (nodes × models, generated as the offline scaling benchmark generates them:
testbed.bench.generated_stack), with the Kubernetes provider writing YAML (renderYamlTo) and every
node's SSH host a stand-in that runs nothing (testbed/standins/ssh.py):
- `pulumi preview`, `pulumi up` of a new stack, and a no-op `pulumi up --expect-no-changes`;
- the same for a bare program: as many components, remote Commands (to the same stand-in hosts,
  chained per node) and ConfigMaps on a YAML-writing provider as the stack has resources, no logic;
- the peak memory of the process that runs the program (testbed/bench_hook);
- the Commands the stand-in was asked to run (0 for a no-op up) and how many nodes had one in
  flight at once during the first up.
For the largest size, where the time goes: the engine's OpenTelemetry spans (`--otel-traces file://`)
of a preview of both programs, a cProfile of our program's process, and the CLI's Go CPU profile of
one more first `up` (`--profiling`). Then (`cluster_up`, not with --quick) the largest stack brought
up once against the loopback cluster (testbed/cluster, one kwok node per stack node) instead of YAML.

Where each part lives: measure.py (the stacks, the bare program, the stand-in hosts, the timed runs),
loopback.py (the run on the loopback cluster), profiling.py (where the largest size's time goes),
report.py (the markdown and the chart), section.py (all of it in order, as `make bench-engine` runs it).
"""

from testbed.bench_fleet.loopback import cluster_up
from testbed.bench_fleet.measure import QUICK_SIZES, SIZES, SKIP_CHECKPOINTS, bare_project, bench_env, fleet_config, fleet_key, node_names
from testbed.bench_fleet.profiling import busy
from testbed.bench_fleet.report import CHART, chart, cluster_markdown, markdown
from testbed.bench_fleet.section import fleet

__all__ = [
    "CHART",
    "QUICK_SIZES",
    "SIZES",
    "SKIP_CHECKPOINTS",
    "bare_project",
    "bench_env",
    "busy",
    "chart",
    "cluster_markdown",
    "cluster_up",
    "fleet",
    "fleet_config",
    "fleet_key",
    "markdown",
    "node_names",
]
