"""Settings of privacy: secure aggregation and differential privacy of the Gram
statistics.

One :func:`~gems_fl.settings.checks.setting` declaration per setting;
:class:`gems_fl.settings.Settings` combines the groups."""

from __future__ import annotations

from dataclasses import dataclass

from gems_fl.settings.checks import at_least, in_range, positive, setting


@dataclass(frozen=True)
class PrivacySettings:
    """What the server may see of each node."""

    secure_aggregation: bool = setting(
        False,
        '`gram`, logistic model: every per-node statistic the point needs travels through '
        "Flower's SecAgg+, so the ServerApp holds only their sums; nodes send no model and "
        'each checks h_G against its own space (docs/privacy.md)', user=True,
        detail='The statistics: Gram matrix, `W_k G_k`, label moments, class counts. Needs '
        'gram-point `auto`, `pooled`, `lda` or `closed-form` and refine-rounds=0')
    secure_threshold: float = setting(
        0.5,
        '`secure-aggregation`: the share of each node\'s SecAgg+ key shares needed to '
        'reconstruct it (SecAgg+ `reconstruction_threshold`); nodes that drop out are '
        'tolerated while every node keeps this share of its neighbours',
        in_range(0.0, 1.0, 'a share of the key shares', closed='right'))
    dp_epsilon: float = setting(
        0.0,
        '`gram`, logistic model: differential privacy. Each node adds Gaussian noise to the '
        'sums over its training rows before they leave it, so its release is (`dp-epsilon`, '
        '`dp-delta`)-DP for one replaced row; it sends no model (docs/privacy.md). 0: off',
        at_least(0, "0: no differential privacy"), node=True, user=True,
        detail='The sums: Gram matrix and label moments, rows clipped to `dp-clip`. The '
        'server solves the pooled and LDA points from the noised sums')
    dp_delta: float = setting(
        1e-5,
        '`dp-epsilon`: the delta of the (epsilon, delta) guarantee each node\'s release keeps',
        in_range(0.0, 1.0, 'a probability', closed='neither'), node=True, user=True)
    dp_clip: float = setting(
        5.0,
        '`dp-epsilon`: each training row\'s features are scaled down to this L2 norm at most '
        'before the sums (the bias input stays 1), which bounds one row\'s influence; in the '
        'features\' units (after `standardize`)',
        positive, node=True, user=True,
        detail='5: of 1, 2, 3, 5, 10 and 15, the best mean pooled validation accuracy over '
        'epsilon 1 and 8 on Fashion-MNIST (benchmarks/dp_clip.py, 2 seeds; at epsilon 1 '
        'alone, 2 was 1 point better)')
    dp_seeded_noise: bool = setting(
        False,
        '`dp-epsilon`: draw the noise from the run\'s seed (repeatable experiments) instead '
        "of the operating system's entropy. A server that knows the seed can subtract the "
        'noise: no privacy against it',
        node=True, lab=True)
