"""Request bodies: the bounded readers (JSON, msgpack, multipart, forms), the server-wide body
budget and the typed route that uses them.
"""
