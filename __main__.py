"""gpu-serving: wires the typed stack config to the components. No logic lives here."""

import pulumi

import stacks
from components.stack import declare

for name, value in declare(stacks.load(), stacks.secret).items():
    pulumi.export(name, value)
