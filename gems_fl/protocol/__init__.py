"""The GEMS protocol on Flower's Message API.

Owns the wire format, what a node does (convex and layer-wise), the server's
strategies, the identity round and the in-process Grid used by the tests and the
reproduction harness. Imports geometry, learning, data, settings and Flower; never
evaluation or running.
"""
