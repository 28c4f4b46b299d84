"""Secret config keys: a name that is probably the secret itself, and a secret value that is the wrong credential.

Nothing here ever returns or prints a value: the messages say what kind of thing was found.
"""

from __future__ import annotations

import re

# Shapes of credentials people paste where the *name* of a secret config key belongs.
TOKEN_PREFIXES = re.compile(r"^(hf_|sk-|sk_|ghp_|gho_|ghs_|github_pat_|glpat-|xox[abprs]-|AKIA|eyJ)")
PUBLIC_KEY = re.compile(r"^(\S+\s+)?(ssh-(ed25519|rsa|dss)|ecdsa-sha2-\S+|sk-(ssh|ecdsa)-\S+)\s+AAAA")
PRIVATE_KEY = "PRIVATE KEY-----"


def looks_like_secret_value(text: str, hex_too: bool = True) -> bool:
    """A secret config key name that is probably the secret itself: a known token prefix, or a
    long random-looking string (a name is words: `vllmApiKey`, `sshHostKeyWorker02`).

    `hex_too=False` for literal values (env, flags), where a long hex string is as likely a commit."""
    if TOKEN_PREFIXES.match(text) and len(text) >= 16:
        return True
    if len(text) < 20:
        return False
    digits = sum(c.isdigit() for c in text)
    upper = sum(c.isupper() for c in text)
    lower = sum(c.islower() for c in text)
    if re.fullmatch(r"[0-9a-fA-F]+", text) and digits >= 4 and hex_too:
        return True  # a hex key
    # Random base62/64: digits, capitals and small letters throughout; a camelCase name has a
    # capital per word, an UPPER_SNAKE one no small letters.
    return digits >= 4 and upper >= 4 and lower >= 4 and (digits + upper) * 10 >= len(text) * 4


def value_problem(role: str, value: str, what: str) -> str | None:
    """What is wrong with a secret's value for the role that reads it (None: nothing recognisably wrong).

    Only what is recognisably another kind of credential is refused, so a value of unknown shape
    (the offline render's placeholders, a self-made API key) always passes."""
    text = value.strip()
    private, public = PRIVATE_KEY in text, bool(PUBLIC_KEY.match(text))
    if role.startswith("host-key") and private:
        return ("holds an SSH private key, but a host key is the node's public key: set it from "
                "`ssh-keyscan -t ed25519 <host> | cut -d' ' -f2-`")
    if role == "ssh-private" and public:
        return ("holds an SSH public key, but the steps log in with the private key "
                "(the text of the key file, -----BEGIN ... PRIVATE KEY-----)")
    api_key = role == "api-key" or role.startswith("tenant-key")
    if (role in ("hf", "kubeconfig") or api_key) and (private or public):
        return f"holds an SSH key, not {what}"
    if api_key and text.startswith("hf_"):
        return ("holds a Hugging Face token (hf_…), which every API client would then hold: give the model an API key "
                "of its own, e.g. from `openssl rand -hex 32`")
    return None
