"""The models' names, without torch: the settings check them before anything heavy loads."""

MODELS = ("logistic", "random-features", "mlp")
#: The convex models: a softmax-linear layer on the inputs, or on their random features
#: (gems_fl.data.random_features maps the inputs before the model sees them).
CONVEX_MODELS = ("logistic", "random-features")
