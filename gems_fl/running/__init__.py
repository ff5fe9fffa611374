"""What an operator runs outside Flower: the ``gems-fl`` command line, the local and
TLS launchers, ``submit`` and ``check-data``. May import everything below it; the
ServerApp's run itself is :mod:`gems_fl.serverapp`.
"""

#: the public modules (each says what it exports)
__all__ = [
    "check_data",
    "cli",
    "federation",
    "launch",
    "outcome",
    "processes",
    "run_config",
    "runlog",
    "signals",
    "submit",
    "superlink",
    "timing",
    "watch",
]
