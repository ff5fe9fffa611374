"""Refinement steps computed directly on the pooled data (not through the apps): which
start and which step rule reach what test accuracy after 10 steps.

    python3 benchmarks/refinement_offline.py

Fashion-MNIST, seed 0, all training rows of the run's split pooled (what the nodes'
gradients and Gram matrices sum to, whatever the division). Starts: the pooled ridge
point (ridge 1e-3) and the LDA point (shrinkage 1e-2), each scaled by the logit scale
with the lowest validation cross-entropy. Step rules: ``monotone``
(``W <- W - 2 g (G + 1e-3 I)^-1``, the run's Bohning step), ``accel`` (Nesterov with
restart, ``refine-method=accelerated``) and ``ls`` (the same direction scaled by the
best of 1, 2, 4, 8 on the pooled training loss: a line search the project does not
build). Prints test accuracy after each of the 10 steps.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np, torch
from gems_fl.data import load_dataset
from gems_fl.geometry.gram import gram_matrix, label_moments
from gems_fl.geometry.pooled import pooled_lda, pooled_point
torch.set_num_threads(1)
s = load_dataset("fashion-mnist", seed=0)
X = torch.tensor(np.c_[s.train_x, np.ones(len(s.train_x))], dtype=torch.float64)
Y = torch.tensor(s.train_y); Xv = torch.tensor(np.c_[s.val_x, np.ones(len(s.val_x))]); Yv = torch.tensor(s.val_y)
Xt = torch.tensor(np.c_[s.test_x, np.ones(len(s.test_x))]); Yt = torch.tensor(s.test_y)
N = len(X); G = X.T @ X / N
g = [gram_matrix(s.train_x)]; m = [label_moments(s.train_x, s.train_y, 10)[0]]
def loss_grad(W):
    z = X @ W.T; p = torch.softmax(z, 1); l = torch.nn.functional.cross_entropy(z, Y)
    p[torch.arange(N), Y] -= 1
    return float(l), (p.T @ X) / N
def acc(W, A=Xt, B=Yt): return float(((A @ W.T).argmax(1) == B).double().mean())
def best_temp(W):
    best = min([0.5,1,2,5,10,20,50], key=lambda t: float(torch.nn.functional.cross_entropy(Xv @ (t*W).T, Yv)))
    return best * W
lam = 1e-3
A = torch.linalg.inv(G + lam * torch.eye(len(G)))
for name, W0 in (("pooled", pooled_point(g, m, [N], 1e-3)), ("lda", pooled_lda(g, m, [N], 1e-2))):
    W0 = best_temp(torch.tensor(W0)); print(name, "start", acc(W0))
    for method in ("monotone", "accel", "ls"):
        W = W0.clone(); Wp = W.clone(); k = 0; last = 1e9; hist = []
        for step in range(1, 11):
            Y_ = W + (k-1)/(k+2)*(W-Wp) if method == "accel" and k > 0 else W
            l, gr = loss_grad(Y_)
            d = -2 * gr @ A
            if method == "ls":
                cands = [(loss_grad(Y_ + t*d)[0], t) for t in (1, 2, 4, 8)]
                t = min(cands)[1]; new = Y_ + t*d
            else:
                new = Y_ + d
            if method == "accel" and l > last: k = 1
            else: k += 1
            last = l; Wp, W = W, new
            hist.append(round(acc(W), 4))
        print(" ", method, hist)
