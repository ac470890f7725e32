"""What the config's keys choose among in core: the encoders built in (`model_args.model`,
`encoders.py`), the classifier's output activations (`model_args.output_activation`, `models.py`)
the robust rules (`server_args.robust_aggregation`, `robust.py`) and the server's optimisers
(`server_args.server_optimizer`, `server_opt.py`). Importing it costs nothing (no
torch), so the config's schema declares them as its fields' allowed values."""

from __future__ import annotations

BUILT_IN = ("simple-cnn", "lg-cnn", "resnet50", "mlp")
OUTPUT_ACTIVATIONS = ("none", "softmax", "log-softmax")
RULES = ("none", "median", "trimmed_mean", "krum", "norm_clip")
SERVER_OPTIMIZERS = ("sgd", "adam", "yogi", "adagrad")
