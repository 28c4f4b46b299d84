"""Write components/node/linked/: each node step's linked script, as every node's copy step delivers it.

    python -m tools.node_scripts        # make node-scripts, after a change under components/node/scripts/

The folder is a snapshot of `components.node.steps.step_files()` (tests/test_node.py keeps them equal), so a review
of a helper's change shows every step it reaches.
"""

from __future__ import annotations

import sys

from components.node.steps import LINKED, step_files


def main() -> int:
    files = step_files()
    LINKED.mkdir(exist_ok=True)
    for stale in set(p.name for p in LINKED.glob("*.sh")) - set(files):
        (LINKED / stale).unlink()
    changed = [name for name, text in sorted(files.items())
               if not (LINKED / name).exists() or (LINKED / name).read_text() != text]
    for name in changed:
        (LINKED / name).write_text(files[name])
    print(f"components/node/linked: {len(changed)} of {len(files)} written" if changed else "components/node/linked: up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
