"""What a run reports: the baselines (one path for both model kinds), the fine-tuning
study, FedAvg/FedProx, and the results tables and JSON.

Imports protocol, learning, data and settings; never running.
"""
