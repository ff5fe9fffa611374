"""The lab beside the product: the paper's studies and what only they use.

``reproduce`` (``gems-fl reproduce``: the paper's tables), ``fine_tuning`` (the
fine-tuning curve a run's ``tune-curve`` asks for), ``fedavg`` (FedAvg/FedProx, the
comparison runs), ``products`` (the pooled LDA point from rounds of Gram products, a
benchmark's geometry) and ``cli`` (the ``reproduce`` subcommand).

The lab imports the product (``gems_fl``); the product never imports the lab. It reaches
the lab's subcommand and studies through the entry points of :mod:`gems_fl.extensions`.
"""

#: the public modules (each says what it exports)
__all__ = ["cli", "fedavg", "fine_tuning", "products", "reproduce"]
