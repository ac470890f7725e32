"""A site's own data, written in the formats people hold from real Fashion-MNIST images: PNG folders
(per party, with different class mixes), CSV / Parquet tables, a saved Hugging Face dataset (the
writers of examples/site_data/write.py, which the data how-to runs), and a site's grey image folder
and per-party folders as the tests write them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tests.support import ROOT

if TYPE_CHECKING:  # the benchmarks import this module where pytest may not be installed
    import pytest

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


def grey_folder(root: Path, n_train: int = 40, n_test: int = 20, split: bool = True) -> Path:
    """A site's grey 28x28 image folder of Fashion-MNIST's first images: `n_train` under train/ and
    `n_test` under test/, or (without `split`) the `n_train` training images in `root` itself."""
    x, y, xt, yt = fashion(n_train, n_test)
    write_pngs(root / "train" if split else root, x, y)
    if split:
        write_pngs(root / "test", xt, yt)
    return root


def site_folders(factory: pytest.TempPathFactory, per_party: int = 40, n_test: int = 20) -> Path:
    """Per-party folders (`party_folders`) in a fresh folder `sites` of the session's temporary tree:
    the sites of a test module's runs."""
    return party_folders(factory.mktemp("sites"), per_party=per_party, n_test=n_test)
