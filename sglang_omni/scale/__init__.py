"""Scale out on Ray Serve: replicas of the whole Omni server behind one endpoint, each request
sent to the replica whose deadline plan admits it earliest, a 503 retried on another replica.

Needs the ``ray`` extra (``pip install 'sglang-omni[ray]'``). Modules: :mod:`.spec` (the config
each replica resolves, the fleet's shape), :mod:`.builder` (the Serve application and the builder
for Serve config files), :mod:`.replica` (a whole server in a replica), :mod:`.gateway` (the HTTP
entry: relay and 503 retry), :mod:`.routers` and :mod:`.ranking` (replica choice),
:mod:`.stats` (routing stats), :mod:`.asgi_call` (a request through the app in-process) and
:mod:`.launch` (``sgl-omni serve --ray``, ``sgl-omni replicas``). Importing this package imports
nothing of Ray; the modules that need it do.
"""
