"""Stand-ins for what the test machines cannot reach or run: the Hugging Face hub, vLLM, and a fleet of SSH hosts.

The hub and vLLM ones are standard library only (the vLLM one runs in an image built from Debian's
python3 with no pip); the SSH one runs under Debian's python3 with its python3-asyncssh. Each names
itself a stand-in where it answers; docs/testbed.md says what they cannot show.
"""
