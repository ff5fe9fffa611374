"""Running GEMS: the ServerApp's run (protocol, then evaluation), the ``gems-fl``
command line, and the local and TLS launchers. May import everything above it.
"""
