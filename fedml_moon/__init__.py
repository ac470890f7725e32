"""fedml_moon: MOON and related federated learning algorithms as a FedML plugin."""

from fedml_moon.adapters.compat import use_fedml_parts

__version__ = "0.1.0"

use_fedml_parts()  # before anything imports FedML: its parts without its package __init__s
