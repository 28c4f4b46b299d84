"""The payload-equivalent bare program of the engine benchmark: our stack's resources, replayed.

The fleet section's bare program declares as many resources as our stack, each small (ConfigMaps,
Commands that run `true`). This one declares the very resources our program declares (same types,
names, parents, inputs, secrets, providers, dependsOn and other options), read from a file, with no
config model, placement check or spec building. Ours against it is what our program itself costs;
ours against the small bare one adds what our objects' size costs the SDK, the wire and the
providers.

    python -m testbed.bench_replay STACK_FILE OUT.json   # the offline render's resources, secrets marked

What it cannot show: inputs that under the real engine are unknown during a preview (a value computed
from another resource's output) are replayed as the offline render saw them, known, and without the
dependency such an input carries (only dependsOn is replayed).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

PROGRAM = '''\
import json
import pulumi

SIG_KEY, SECRET_SIG = "4dabf18193072939515e22adb298388d", "1b47061264138c4ac30d75fd1eb44270"


def value(raw):
    if isinstance(raw, dict) and raw.get(SIG_KEY) == SECRET_SIG:
        return pulumi.Output.secret(raw.get("value"))
    if isinstance(raw, dict):
        return {key: value(item) for key, item in raw.items()}
    if isinstance(raw, list):
        return [value(item) for item in raw]
    return raw


made = {}
for r in json.loads(open(pulumi.Config().require("resources")).read()):
    o = r["options"]
    timeouts = o.get("customTimeouts") or {}
    opts = pulumi.ResourceOptions(
        parent=made.get(r["parent"]), provider=made.get(o.get("provider")),
        depends_on=[made[urn] for urn in o.get("dependsOn", [])],
        custom_timeouts=pulumi.CustomTimeouts(**timeouts) if timeouts else None,
        retain_on_delete=o.get("retainOnDelete"), delete_before_replace=o.get("deleteBeforeReplace"),
        additional_secret_outputs=o.get("additionalSecretOutputs"), replace_on_changes=o.get("replaceOnChanges"),
        ignore_changes=o.get("ignoreChanges"))
    if r["type"].startswith("pulumi:providers:"):
        made[r["urn"]] = pulumi.ProviderResource(r["type"].split(":")[2], r["name"], value(r["inputs"]), opts)
    elif r["custom"]:
        made[r["urn"]] = pulumi.CustomResource(r["type"], r["name"], value(r["inputs"]), opts)
    else:
        made[r["urn"]] = pulumi.ComponentResource(r["type"], r["name"], None, opts)
        made[r["urn"]].register_outputs({})
'''
"""The replaying program (`resources`: the file `dump` writes)."""


def dump(stack_file: Path, out: Path) -> int:
    """The offline render's resources as the program declared them, secret values marked (not blanked),
    each after its parent, its provider and what it depends on; how many."""
    from tools.render import run_program

    render = run_program("replay", stack_file=stack_file)
    out.write_text(json.dumps([{"urn": r.urn, "type": r.type, "name": r.name, "parent": r.parent, "custom": r.custom,
                                "inputs": r.inputs, "options": r.options} for r in declaration_order(render.resources)]))
    return len(render.resources)


def declaration_order(resources: list[Any]) -> list[Any]:
    """The render lists resources by URN (a child's sorts before its parent's): the replay must declare
    each after the resources it names."""
    by_urn = {r.urn: r for r in resources}
    ordered: list[Any] = []
    placed: set[str] = set()

    def place(resource: Any) -> None:
        if resource.urn in placed:
            return
        placed.add(resource.urn)
        for urn in (resource.parent, resource.options.get("provider"), *resource.options.get("dependsOn", [])):
            if urn in by_urn:
                place(by_urn[urn])
        ordered.append(resource)

    for resource in resources:
        place(resource)
    return ordered


if __name__ == "__main__":
    print(dump(Path(sys.argv[1]), Path(sys.argv[2])))
