"""What a run reports: the baselines (one path for both model kinds), the fine-tuning
study, FedAvg/FedProx, and the results tables and JSON.

Imports protocol, learning, data and settings; never running.
"""

#: the public modules (each says what it exports)
__all__ = [
    "baselines",
    "fedavg",
    "fine_tuning",
    "local_models",
    "results",
    "results_bundle",
    "server_data",
]
