"""The same weights every time: where the cluster requires it, a model names a commit, not a branch or tag."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from stacks.config.base import COMMIT_SHA, _at

if TYPE_CHECKING:
    from stacks.config.stack import StackConfig


def check_revision(stack: StackConfig, i: int) -> None:
    model = stack.models[i]
    if stack.cluster.require_commit_revisions and not re.fullmatch(COMMIT_SHA, model.revision):
        raise _at(
            f"models[{i}].revision",
            f"{model.revision!r} is a branch or tag, which moves: pin the 40-hex commit it points at "
            f"(the model page's commit history, or `hf download --revision {model.revision}` prints the "
            "snapshot path), or set cluster.requireCommitRevisions: false for a lab",
        )
