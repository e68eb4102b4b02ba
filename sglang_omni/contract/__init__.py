"""The stage contract every layer may import: what crosses between the server and a stage, and
what the server asks of a model.

* ``job``: the ``Job`` an engine runs, the ``Engine`` interface every backend implements, the
  ``EngineSpec`` a stage builds its engine from, and the span and chunk constants.
* ``gpu_turns``: the generation stage's GPU turns (the oldest request's job first, a younger
  one paused at a denoising step boundary), which a job's ``step_boundary`` calls into.
* ``result``: ``StageResult``, a stage's answer, and ``Frames``.
* ``payloads``: the payloads the built-in reasoner and generation engines speak, by role.
* ``generation_options``: ``stage_params.generation``, the options a generation accepts.
* ``actions``: the native action route's fields and checks, as an engine sees them.
* ``model``: the ``ServedModel`` interface a model package provides (its limits, defaults and
  action request handling), which the HTTP layer asks of the configured pipeline.
* ``encoding_settings``: the generation stage's x264 factory options and the encoding an
  engine reads from them (a model's pipeline declares them; engines read them).
* ``parallelism``: which native server arguments spread a generation over several GPUs.
* ``messages``: the stage wire's messages, one type per operation, and their one codec
  (``encode``, ``decode``: a message that fails to decode is a ``ProtocolError`` naming its
  field).

It imports only ``errors``, ``media`` and ``config``; engines, the runtime, the pipeline, the
model packages and the HTTP layer all sit above it.
"""
