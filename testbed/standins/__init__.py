"""Stand-ins for what the test machines cannot reach or run: the Hugging Face hub and vLLM.

Each is standard library only (the vLLM one runs in an image built from Debian's python3 with no
pip) and names itself a stand-in where it answers; docs/testbed.md says what they cannot show.
"""
