"""The offline render (`python -m tools.render`, `make render`): the unchanged `__main__.py` under
Pulumi's mock engine, written out as the files a reviewer reads. One module per concern:

- `stack_file`: the config `pulumi up` would pass, read from Pulumi.yaml and Pulumi.<stack>.yaml;
- `mock_engine`: the program run under mocks, every resource it declares recorded (`run_program`);
- `model`: what a render holds (`Render`, `Resource`) and the order `pulumi up` applies objects in;
- `redaction`: secret values out of everything written;
- `files`: the output folder (manifests, resources, outputs, node scripts), swapped in whole;
- `findings`: the policy pack's findings and the thresholds it judges the stack by;
- `sdk`: the Pulumi SDK internals all of this relies on, with the SDK release they were checked against;
- `cli`: the command line, its messages and what it writes (its docstring).
"""

from tools.render.cli import main
from tools.render.files import ManifestDumper, manifests_yaml, node_scripts, resources_json, write
from tools.render.findings import policy_config, policy_config_json, policy_violations
from tools.render.mock_engine import run_program
from tools.render.redaction import is_secret, redact
from tools.render.result import Render, RenderError
from tools.render.stack_file import ROOT, parsed_config, stack_config

__all__ = [
    "ROOT",
    "ManifestDumper",
    "Render",
    "RenderError",
    "is_secret",
    "main",
    "manifests_yaml",
    "node_scripts",
    "parsed_config",
    "policy_config",
    "policy_config_json",
    "policy_violations",
    "redact",
    "resources_json",
    "run_program",
    "stack_config",
    "write",
]
