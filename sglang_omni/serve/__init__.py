"""The HTTP layer: FastAPI app, routes, SSE framing and error translation."""
