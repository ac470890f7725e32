"""What a config's keys mean together, for every room that reads a config (the data's readers among
them) without the algorithms `config.load` checks it against: whether the sites hold their own data
and where evaluation runs."""

from __future__ import annotations

from fedml_moon.config.schema import Config


def own_data(cfg: Config) -> bool:
    """Whether each silo trains on its own data and the server holds none: cross-silo with a site's
    own data (`data_args.dataset` imagefolder, table, hf or plugin) and `partition_method: natural`."""
    data = cfg.data_args
    return (
        cfg.common_args.training_type == "cross_silo"
        and data.site_format
        and data.partition_method == "natural"
    )


def evaluation(cfg: Config) -> str:
    """`validation_args.evaluation` resolved: auto is federated where the server holds no data
    (`own_data`), else central."""
    said = cfg.validation_args.evaluation
    return said if said != "auto" else ("federated" if own_data(cfg) else "central")
