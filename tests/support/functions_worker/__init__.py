"""The Functions host's side of the worker protocol (``host.py``) and the contract it speaks."""
