"""The HTTP server's own hardening: uvicorn/h11 connection timeouts, head limits, the WebSocket
protocol, API-key auth, client disconnects, and the middleware that holds each exchange's
request state.
"""
