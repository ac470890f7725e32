"""`fedml-moon data DIR --cf CONFIG`: a site's folder read and checked by the code a run's process
runs at start-up (`data.federated.prepare`, or a cross-silo silo's `prepare_own`), so that whatever
the run would refuse is refused here first, in the run's words, before any process starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fedml_moon.config.derived import evaluation, own_data
from fedml_moon.config.schema import Config
from fedml_moon.errors import ConfigError

if TYPE_CHECKING:
    from fedml_moon.data.federated import FederatedData
    from fedml_moon.data.inspect import Survey


@dataclass
class Verdict:
    """What the run's start-up reading said: the readings that passed, in words, and its refusal."""

    read: list[str] = field(default_factory=list)
    refusal: str | None = None
    parties: list[str] = field(default_factory=list)  # the party names the readings found


def _described(fed: FederatedData, who: str) -> str:
    data = fed.data
    shape = "x".join(str(s) for s in data.input_shape)
    return f"{who}: {len(data.y_train)} train / {len(data.y_test)} test samples of shape {shape}"


def _silos(cfg: Config, ranks: list[int], verdict: Verdict, asked: bool = True) -> None:
    """Each silo rank's reading, as `fedml-moon run --rank R` reads; data that are one site's (a
    plugin's, say) give every rank the same party, so the reading stops at the first party repeated.
    A site's own folder read without `asked` for a rank is the folder of whichever silo runs it: it
    is named so, not as rank 1's."""
    from fedml_moon.data.federated import prepare_own

    seed = cfg.common_args.random_seed
    for rank in ranks:
        fed = prepare_own(cfg.data_args, seed, rank - 1)
        name = fed.data.parties.names[0]
        if name in verdict.parties:  # one site's folder: every rank reads it
            return
        verdict.parties.append(name)
        who = f"silo rank {rank} (party {rank - 1}, {name})"
        if not asked and len(ranks) == 1:
            who = f"the silo whose folder it is ({name}; --rank R reads it as silo R)"
        verdict.read.append(_described(fed, who))


def server_hint(cfg: Config) -> str:
    """What a cross-silo server's data refusal adds where the sites hold their own data but the
    partition is not natural: why the server reads the folder at all, and the switch that makes it
    read nothing."""
    args = cfg.data_args
    if cfg.common_args.training_type != "cross_silo" or not args.site_format or own_data(cfg):
        return ""
    return (
        f" (the server reads data_cache_dir because data_args.partition_method is {args.partition_method}: "
        "every process reads the whole data set and keeps its share; with partition_method: natural each "
        "silo reads its own data and the server reads nothing)"
    )


def _ranks(cfg: Config) -> list[int]:
    """The silo ranks whose reading to check: rank 1 where the folder is one site's (every rank
    reads it alike), else every silo's, which reads its own party of the per-party folder."""
    from fedml_moon.data.formats import DataFileError

    args = cfg.data_args
    root = Path(args.data_cache_dir or ".")
    try:
        if args.dataset != "plugin" and root.is_dir() and one_site(cfg, root):
            return [1]
    except (ConfigError, DataFileError):
        pass  # unreadable: the silos' reading says why
    return list(range(1, cfg.train_args.client_num_in_total + 1))


def check_site(cfg: Config, rank: int | None = None) -> Verdict:
    """Read the data as the run's process of `rank` does at start-up (0 the server, R silo R; None:
    every silo of a cross-silo run on the sites' own data, or the one reading every process of any
    other run makes), stopping at the first refusal, which `Verdict.refusal` holds."""
    from fedml_moon.data.federated import prepare, prepare_own

    verdict = Verdict()
    args, seed, n = cfg.data_args, cfg.common_args.random_seed, cfg.train_args.client_num_in_total
    try:
        if not own_data(cfg):
            fed = prepare(args, n, seed)
            verdict.parties = list(fed.data.parties.names) if fed.data.parties else []
            verdict.read.append(_described(fed, f"the whole data set, {n} parties"))
        elif rank == 0:
            fed = prepare_own(args, seed, None, central=evaluation(cfg) == "central")
            verdict.read.append(
                _described(fed, "the server (its central test set)")
                if len(fed.data.y_test)
                else "the server: reads no data (each silo tests on its own split)"
            )
        else:
            _silos(cfg, [rank] if rank else _ranks(cfg), verdict, asked=rank is not None)
    except ConfigError as err:
        verdict.refusal = str(err) + (server_hint(cfg) if rank == 0 else "")
    return verdict


def one_site(cfg: Config, root: Path) -> bool:
    """Whether a cross-silo silo's folder is one site's (not one folder or party-column value per
    party), as the silo's reading tells them apart (`data.silo`)."""
    from fedml_moon.data import silo, tables

    args = cfg.data_args
    if args.dataset == "imagefolder":
        return silo.single_site(root, args.classes)
    if args.dataset == "table":
        train = tables.find_table(root, "train")
        return train is None or args.party_column not in tables.read_frame(train).columns
    return not silo._has_party_column(args, root)


def _survey(cfg: Config, root: Path) -> tuple[bool, Survey] | None:
    """`inspect`'s survey of the folder as the config reads it, or None (a plugin's data, a folder
    that is not there); a file it cannot read is one of its problems."""
    from fedml_moon.data.formats import DataFileError
    from fedml_moon.data.inspect import survey_of

    args = cfg.data_args
    if args.dataset == "plugin" or not args.data_cache_dir or not root.is_dir():
        return None
    try:
        natural = args.partition_method == "natural" and not (own_data(cfg) and one_site(cfg, root))
        return natural, survey_of(root, args.dataset, natural, args.label_column, args.party_column,
                                  args.image_column)  # fmt: skip
    except (ConfigError, DataFileError) as err:
        from fedml_moon.data.inspect import Survey

        return False, Survey(problems=[f"cannot be surveyed: {err}"])


def inspect_with_config(cfg: Config, cf: str, rank: int | None = None) -> tuple[str, int]:
    """The survey of the config's `data_cache_dir` beside the run's start-up reading of it
    (`check_site`): the report, and how many problems (the run's refusal one of them) were found."""
    from fedml_moon.data.inspect import Survey, report

    root = Path(cfg.data_args.data_cache_dir or ".")
    verdict = check_site(cfg, rank)
    natural, survey = _survey(cfg, root) or (None, Survey())
    if verdict.refusal:  # a problem the survey found too is said once, in the run's words
        survey.problems = [p for p in survey.problems if not _same_file(p, verdict.refusal)]
        survey.problems.insert(0, f"the run refuses it: {verdict.refusal}")
    who = {None: "", 0: ", as the server reads"}.get(rank, f", as silo rank {rank} reads")
    checked = [f"the run's start-up reading ({cf}{who}):"] + [f"  {line}" for line in verdict.read]
    checked.append("  refused: the first problem below" if verdict.refusal else "  passed")
    classes = list(cfg.data_args.classes)
    text = report(root, cfg.data_args.dataset, survey, bool(natural), classes, tuple(checked))
    if natural is None:  # nothing surveyed (a plugin's data, or no folder named): the reading alone
        text = text[text.index(checked[0]) :]
    return text, len(survey.problems)


def _same_file(problem: str, refusal: str) -> bool:
    """Whether the survey's `problem` (`<what>: <file> (<why>)`) names the file the run's `refusal` names."""
    named = problem.partition(": ")[2].partition(" (")[0].strip()
    return bool(named) and ("/" in named or "." in named) and named in refusal
