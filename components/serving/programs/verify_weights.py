import json, os, pathlib, re, sys
# The serving pod's first container, on a node cache: the node's weights label says its download Job completed;
# this checks the node's array still says so (a replaced disk, or an array not mounted under the label).
markers, node = pathlib.Path(os.environ["GS_MARKER_DIR"]), os.environ["GS_NODE"]
missing = []
for repo, revision in json.loads(os.environ["GS_REPOS"]):
    stem = repo.replace("/", "--")
    # A commit names its marker; a lab's branch is matched by any commit of the repository.
    found = [markers / f"{stem}@{revision}.done"] if re.fullmatch("[0-9a-f]{40}", revision) else sorted(markers.glob(f"{stem}@*.done"))
    if not any(m.is_file() and pathlib.Path(m.read_text().strip()).is_dir() for m in found):
        missing.append(f"{repo}@{revision}")
if missing:
    print(f"ERROR: {node} is labelled as holding {', '.join(missing)} but its array has no complete download of it "
          f"(no marker with its snapshot under {markers}: a replaced disk, or the array not mounted): re-run the node's "
          "download Job with `pulumi up --replace <its URN>`", file=sys.stderr)
    sys.exit(1)
print(f"{node}: the weights are on its array")
