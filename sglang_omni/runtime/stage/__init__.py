"""A stage process and the server's end of it: the handle the pipeline calls (``handle``),
its calls (``calls``), link (``link``), child process (``child``), faults and reports; the
stage's own loop (``process``)."""
