import json, os, subprocess, sys
for repo, revision in json.loads(os.environ["GS_REPOS"]):
    code = subprocess.call([sys.executable, "-c", sys.argv[1]], env={**os.environ, "GS_REPO": repo, "GS_REVISION": revision})
    if code:
        sys.exit(code)
