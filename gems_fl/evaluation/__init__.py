"""What a run reports: the baselines (one path for both model kinds), and the results
tables and JSON (the studies, FedAvg/FedProx among them, are the lab's: ``gems_lab``).

Imports protocol, learning, data and settings; never running.
"""

#: the public modules (each says what it exports)
__all__ = [
    "baselines",
    "local_models",
    "results",
    "results_bundle",
    "run_files",
    "server_data",
]
