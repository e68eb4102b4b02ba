"""The wire's typed request and response models (pydantic), one module per route family.

Every route's body is one of these models, so ``/openapi.json`` and ``/docs`` show real
schemas. A model's field checks call the rule's one home (the sampling number fields, the
generation option table, the chat message rules) and raise :data:`FIELD_ERROR` with what to
change; :mod:`sglang_omni.serve.wire.validation` turns the first error into the 400 body
(``"<field path>: <what to change>"``). Models allow unknown fields: each route refuses them
itself, naming where a native field goes instead.
"""
