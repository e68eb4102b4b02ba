"""The native backends: native SGLang engines run inside Omni's stage processes.

Modules here import sglang only inside the backend classes that need it (``reasoner``, the
generation backend, the cancellation plugin's hooks), so the helpers (``server_args``,
``reasoner_request``, ``lifecycle``) work without the ``native`` extra installed.
"""
