"""Rolling the serving pods when their API key changes, without the key or a guessable hash in sight.

vLLM reads `VLLM_API_KEY` once, at start, through a `secretKeyRef`: `pulumi up` after
`pulumi config set --secret <apiKeySecret>` updates the Secret, and the running servers keep
accepting the old (possibly leaked) key. The pod template must change with the key, so the
Deployment rolls (with its own GPU-safe strategy: `maxSurge: 0`), and the smoke test runs again
against the new key.

What changes with the key is the annotation ANNOTATION, and what it holds is chosen with care:

- Everyone who may read Deployments, the offline render, `make diff` and the Pulumi state (where
  the value is plain, not `[secret]`) sees it: far more people than may read Secrets. A plain
  hash of the key, or one salted with something in the manifest (the model's name), lets any of
  them test guessed keys offline at hashing speed, and API keys are often chosen by people.
- So it is HMAC-SHA256 keyed with a secret salt: without the salt it is not computable from a
  guess, and the salt is in no manifest. The same salt and key give the same value, so the render
  stays byte-identical and an unchanged stack stays a no-op.
- The salt is a secret config key of its own (`rolloutSalt`, random, set once). A salt drawn at
  each run would roll every GPU server on every `pulumi up`; one kept in the state needs the random
  provider and makes the offline render differ from run to run; one derived from another
  credential (the HF token, an SSH key) would restart the GPU servers whenever that one rotates,
  and rotating the HF token must change nothing but the Secret (the servers never read it).
- The model's namespace and name are part of the message, so two models that share a key do not
  show the same value (which would tell a reader that they do).

Only the API key is treated so: the HF token is read by the download Job alone, whose pod reads
the Secret when it starts and is gone once it completes; the next download Job reads the new token.
"""

from __future__ import annotations

import hashlib
import hmac

import pulumi

ANNOTATION = "gpu-serving/api-key-hmac"


def api_key_digest(salt: str, api_key: str, namespace: str, model: str) -> str:
    """What the annotation holds: an HMAC of the key under the secret salt, shortened to 128 bits."""
    message = f"gpu-serving api key\0{namespace}\0{model}\0{api_key}".encode()
    return "hmac-sha256:" + hmac.new(salt.encode(), message, hashlib.sha256).hexdigest()[:32]


def api_key_annotation(
    salt: pulumi.Input[str], api_key: pulumi.Input[str], namespace: str, model: str
) -> dict[str, pulumi.Output[str]]:
    """The pod-template annotation that changes exactly when the key (or the salt) does.

    Unsecret: the value is safe to show (see the module's docstring), and a secret-marked input
    would make the provider hide the whole Deployment's diff."""
    digest = pulumi.Output.all(salt, api_key).apply(lambda values: api_key_digest(values[0], values[1], namespace, model))
    return {ANNOTATION: pulumi.Output.unsecret(digest)}
