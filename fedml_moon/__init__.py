"""fedml_moon: MOON and related federated learning algorithms as a FedML plugin."""

from fedml_moon.adapters.compat import quiet_import_warnings

__version__ = "0.1.0"

quiet_import_warnings()  # before anything imports requests or fedml
