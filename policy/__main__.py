"""Entry point of the policy pack: `pulumi preview --policy-pack policy`.

The CLI runs this file with runpy from inside policy/ (no parent package);
`python -m policy` from the repository root imports it as a package.
"""

from pulumi_policy import PolicyPack

if __package__:
    from .rules.pack import build_policies
else:
    from rules.pack import build_policies

PolicyPack(name="gpu-serving", policies=build_policies())
