"""What an operator runs outside Flower: the ``gems-fl`` command line, the local and
TLS launchers, ``submit`` and ``check-data``. May import everything below it; the
ServerApp's run itself is :mod:`gems_fl.serverapp`.
"""
