"""fedml_moon: MOON and related federated learning algorithms as a FedML plugin."""

__version__ = "0.1.0"
