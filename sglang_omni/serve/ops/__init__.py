"""Running the server: start-up, shutdown, metrics, the request log, info and docs routes, the
playground, mode routing and service paths.
"""
