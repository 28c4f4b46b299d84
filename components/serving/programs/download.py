EXIT_AUTH, EXIT_NOT_FOUND = 10, 11
import os, pathlib, re, sys
from huggingface_hub import HfApi, snapshot_download
from huggingface_hub.utils import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError
repo, revision = os.environ["GS_REPO"], os.environ["GS_REVISION"]
cache, markers = os.environ["HF_HUB_CACHE"], pathlib.Path(os.environ["GS_MARKER_DIR"])
def fail(code, what):
    print(f"ERROR: {repo}@{revision}: {what}", file=sys.stderr)
    sys.exit(code)
try:
    # A commit needs no look-up (a re-run stays offline); a branch or tag is resolved first.
    commit = revision if re.fullmatch("[0-9a-f]{40}", revision) else HfApi().model_info(repo, revision=revision).sha
    marker = markers / f"{repo.replace('/', '--')}@{commit}.done"
    if marker.exists():
        print(f"{repo}@{commit} is already in {cache}: nothing to do")
        sys.exit(0)
    ignore = ["original/*"]  # vLLM ignores these too
    if any(f.endswith(".safetensors") for f in HfApi().list_repo_files(repo, revision=commit)):
        ignore += ["*.bin", "*.pt", "*.pth"]  # vLLM loads safetensors when both exist
    # By the configured revision: the cache then records refs/<branch>, which the offline server reads.
    path = snapshot_download(repo, revision=revision, cache_dir=cache, ignore_patterns=ignore)
except GatedRepoError:
    fail(EXIT_AUTH, "gated repository: accept its terms on huggingface.co with the token's account, then re-run")
except RevisionNotFoundError:
    fail(EXIT_NOT_FOUND, "no such revision: fix models[].revision")
except RepositoryNotFoundError:
    fail(EXIT_NOT_FOUND, "no such repository, or private and the token may not read it: fix huggingFaceId or the token")
except HfHubHTTPError as error:
    status = getattr(error.response, "status_code", None)
    if status in (401, 403):
        fail(EXIT_AUTH, f"the hub refused the token ({status}): set a valid hfToken secret")
    raise
# The snapshot folder is named by the commit it holds: a branch that moved meanwhile is keyed right.
marker = markers / f"{repo.replace('/', '--')}@{pathlib.PurePath(path).name}.done"
marker.parent.mkdir(parents=True, exist_ok=True)
marker.write_text(path + "\n")
print(f"{repo}@{marker.stem.split('@')[-1]} ready in {path}")
