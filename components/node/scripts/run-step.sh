#!/usr/bin/env bash
set -euo pipefail
# The tail of every node step's Command: its parameters come first, then this. It runs the step's linked script (the
# lib.sh helpers it calls and its body, components/node/linked/), which the node's copy step delivered once under
# GS_STEPS_DIR/<version>/linked/; found by its sha256, so the Command names exactly the text it runs and changes (and runs
# again) only when that text or its parameters change. A file that is missing or changed is refused: only the copy
# makes it, and sourcing something else would run what nobody reviewed. A delete (GS_IF_MISSING=note) only notes it.
: "${GS_STEPS_DIR:?}" "${GS_SCRIPT:?}" "${GS_SCRIPT_SHA256:?}" "${GS_COPY_STEP:?}"

gs_script=
for gs_candidate in "$GS_STEPS_DIR"/*/linked/"$GS_SCRIPT"; do
  [[ -f $gs_candidate ]] || continue
  if [[ $(sha256sum <"$gs_candidate") == "$GS_SCRIPT_SHA256  -" ]]; then
    gs_script=$gs_candidate
    break
  fi
done
if [[ -z $gs_script && ${GS_IF_MISSING:-refuse} == note ]]; then
  # A delete: it only says what it kept, and must never stop the removal of a step or a stack.
  echo "gpu-serving $GS_SCRIPT: deleted from the stack; nothing on this node was changed (its explanation is not on this node)"
  exit 0
fi
if [[ -z $gs_script ]]; then
  echo "ERROR: no $GS_SCRIPT with sha256 $GS_SCRIPT_SHA256 under $GS_STEPS_DIR on this node (deleted or changed): copy the step files again with \`pulumi up --replace\` of the copy step $GS_COPY_STEP, then run \`pulumi up\`" >&2
  exit 1
fi
# shellcheck source=/dev/null
source "$gs_script"
