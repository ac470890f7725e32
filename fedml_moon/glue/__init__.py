"""Glue between the plugin's algorithms and FedML 0.9.6 (runner, trainer, aggregator, compatibility)."""
