"""The HTTP wire: error shape, responses, SSE framing, the interleaved result forms and OpenAI
chat shapes, and translation of validation errors.
"""
