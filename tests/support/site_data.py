"""A site's own data, written in the formats people hold from real Fashion-MNIST images: PNG folders
(per party, with different class mixes), CSV / Parquet tables, a saved Hugging Face dataset (the
writers of examples/site_data/write.py, which the data how-to runs)."""

from __future__ import annotations

import importlib.util
import sys

from tests.support import ROOT

_WRITER = ROOT / "examples" / "site_data" / "write.py"
_spec = importlib.util.spec_from_file_location("fedml_moon_example_site_data", _WRITER)
_writer = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))
if not hasattr(_writer, "CLASSES"):
    _spec.loader.exec_module(_writer)

CLASSES, MIXES, fashion, write_pngs = _writer.CLASSES, _writer.MIXES, _writer.fashion, _writer.write_pngs
party_folders, table_frame, write_table, write_hf = (
    _writer.party_folders,
    _writer.table_frame,
    _writer.write_table,
    _writer.write_hf,
)
SITE = {  # the config lines a site's Fashion-MNIST folders agree to
    "data_args.classes": "[" + ",".join(CLASSES) + "]",
    "data_args.image_size": "28",
    "data_args.channels": "1",
}


def site_sets(extra: dict[str, str] | None = None) -> list[str]:
    """`--set` overrides for the agreement (and `extra`)."""
    return [f"{k}={v}" for k, v in {**SITE, **(extra or {})}.items()]


def site_args(**kw):
    """Checked `DataArgs` of a grey 28x28 image-folder site with these classes (`kw` replaces any)."""
    from fedml_moon.config.schema import DataArgs

    base = {"classes": CLASSES, "image_size": 28, "channels": 1, "dataset": "imagefolder"}
    args = DataArgs(**{**base, **kw})
    args.check()
    args.check_agreement()
    return args
