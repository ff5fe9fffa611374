"""The named choices of the geometry, as plain constants: settings validate against them
without importing numpy-heavy or torch modules."""

SPACE_KINDS = ("ball", "ellipsoid", "gram")
PAPER_SPACE_KINDS = ("ball", "ellipsoid")  # the paper's parameter-space spaces
ELLIPSOID_FLOORS = ("quantile", "paper")
GRAM_WEIGHTINGS = ("samples", "radius")
GRAM_POINTS = ("auto", "pooled", "lda", "best", "closed-form", "shared")
# the points fitted to the labels (they need label moments); `auto` chooses on validation
# among the pooled point, the pooled LDA point and the closed-form center
POOLED_POINTS = ("auto", "pooled", "lda", "best")
# pooled-ridge=auto: the ridges the selection round scores on the nodes' validation data
# (relative to one mean Gram matrix), and the one a layer without that round uses.
POOLED_RIDGES = (1e-4, 1e-3, 1e-2, 1e-1)
DEFAULT_POOLED_RIDGE = 1e-3
# gram-point=auto: the LDA point's shrinkages the selection round also scores (relative to
# the mean eigenvalue of the pooled within-class covariance)
LDA_SHRINKAGES = (1e-3, 1e-2, 1e-1)
# refine-method: Bohning steps scaled by the secant curvature (checked, backtracking), plain
# Bohning steps, or with momentum
REFINE_METHODS = ("secant", "monotone", "accelerated")
# refine-l2: the L2 penalty of the refined objective, relative to the mean diagonal of the
# pooled Gram matrix (benchmarks/refinement_offline.py: best pooled validation accuracy)
DEFAULT_REFINE_L2 = 1e-3
# refine-method=secant: the smallest curvature scale, so a step is at most 1/0.05 = 20
# Bohning steps long
SECANT_FLOOR = 0.05
NO_INTERSECTION_FALLBACKS = ("min-penalty", "mean")
# Each kind's default upper end of the radius bisection, in the units of its radius
# (gems_fl.geometry.kinds says which). 4000 is the paper's R_max; gram keeps the bound its
# runs have always used, so that a search still passing there is reported saturated.
SPACE_R_MAX = {"ball": 4000.0, "ellipsoid": 4000.0, "gram": 4000.0}
