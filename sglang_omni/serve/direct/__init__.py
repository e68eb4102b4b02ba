"""Direct generation: the native image, video and action routes, their admission, fields, stores
and jobs.
"""
