"""The named choices of the geometry, as plain constants: settings validate against them
without importing numpy-heavy or torch modules."""

SPACE_KINDS = ("ball", "ellipsoid", "gram")
PAPER_SPACE_KINDS = ("ball", "ellipsoid")  # the paper's parameter-space spaces
ELLIPSOID_FLOORS = ("quantile", "paper")
GRAM_WEIGHTINGS = ("samples", "radius")
GRAM_POINTS = ("closed-form", "shared")
NO_INTERSECTION_FALLBACKS = ("min-penalty", "mean")
