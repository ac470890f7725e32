"""Typed sections of the plugin's config; each mirrors a section of FedML's `fedml_config.yaml`.

Field types drive validation in `fedml_moon.config.load`; `check()` methods hold the value rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedml_moon.config.fields import choice
from fedml_moon.core.buffering import (
    AGGREGATIONS,
    BUFFER_WEIGHTS,
    BUFFERED_RULES,
    PARTY_SPEEDS,
    SPEED_DRAWS,
    STALENESS,
    buffer_value_checks,
    speed_value_checks,
)
from fedml_moon.core.choices import BUILT_IN, OUTPUT_ACTIVATIONS, RULES, SERVER_OPTIMIZERS
from fedml_moon.errors import ConfigError, require  # noqa: F401  (ConfigError: imported from here too)
from fedml_moon.privacy.options import PrivacyArgs

TRAINING_TYPES = ("simulation", "cross_silo")


SCENARIOS = ("horizontal", "hierarchical")


@dataclass
class CommonArgs:
    training_type: str = choice("simulation", TRAINING_TYPES)
    """simulation (standalone or MPI simulation) or cross_silo (one process per silo)"""
    random_seed: int = 0
    """the run's one seed: partition, sampling, local test splits, initial models, batch orders"""
    scenario: str = choice("horizontal", SCENARIOS)
    """horizontal (a silo is one process) or hierarchical (a silo is a group of processes, data-parallel)"""
    using_mlops: bool = False
    """FedML's cloud MLOps; must be false (FedML's cloud is never contacted)"""
    plugins: list[str] = field(default_factory=list)
    """algorithms to load as module:attribute from the config's folder, this directory or the Python path"""

    def check(self) -> None:
        require(
            self.training_type in TRAINING_TYPES,
            "common_args.training_type",
            f"{self.training_type!r} is not supported; use 'simulation' or 'cross_silo'",
        )
        require(not self.using_mlops, "common_args.using_mlops", "FedML's cloud MLOps is not used; set false")
        require(
            self.scenario in SCENARIOS,
            "common_args.scenario",
            f"horizontal (a silo is one process) or hierarchical (a process group); got {self.scenario!r}",
        )


AUGMENTATIONS = ("none", "cifar10", "cifar100", "crop-flip")  # data.augment implements them
PARTITIONS = ("hetero", "homo", "shards", "natural", "file")
SITE_FORMATS = ("imagefolder", "table", "hf", "plugin")  # a site's own data: data.site reads them
DATASETS = ("fashion-mnist", "mnist", "cifar10", "cifar100", "tiny-imagenet")  # data.datasets reads them


@dataclass
class DataArgs:
    dataset: str = choice("fashion-mnist", (*DATASETS, *SITE_FORMATS))
    """a public data set (any case, _ for -), or a site's own: imagefolder, table, hf, plugin (how-to/data)"""
    data_cache_dir: str | None = None
    """the folder holding the data files, then their only source; null: Debian's package, else ./data"""
    classes: list[str] | None = None
    """the ordered class names each site's data must use (a site's own data: required); null: the set's"""
    image_size: int | None = None
    """the input's side in pixels: a site's images are resized to image_size x image_size (a table: 1)"""
    channels: int | None = None
    """the input's channels, every image's (1 grey, 3 RGB; a table: its number of feature columns)"""
    label_column: str = "label"
    """a table's or Hugging Face dataset's column holding the class (a name in classes, or its index)"""
    image_column: str = "image"
    """a Hugging Face dataset's column holding the images"""
    party_column: str = "party"
    """a table's or Hugging Face dataset's column naming each sample's party (partition_method natural)"""
    feature_columns: list[str] | None = None
    """a table's feature columns, in the model's order; null: every column but the label and party"""
    plugin: str | None = None
    """dataset plugin: module:function returning the site's (train, test) torch Datasets (a silo's own)"""
    test_fraction: float = 0.2
    """a site's data without a test split: the seeded share of each party's samples kept for testing"""
    download: bool = False
    """download missing data files into data_cache_dir (./data when it is null); needs network access"""
    partition_method: str = choice("hetero", PARTITIONS)
    """how samples are split: hetero (Dirichlet), homo (IID), shards, natural (the data's), file (a run's)"""
    partition_path: str | None = None
    """partition_method file: a partition.json a run wrote (each party's train and local-test indices)"""
    partition_alpha: float = 0.5
    """beta of hetero's per-class Dirichlet(beta) split: smaller is more skewed; > 0"""
    shards_per_client: int = 2
    """label shards per party under partition_method shards; >= 1"""
    min_samples_per_client: int = 10
    """hetero redraws the split until every party holds at least this many training samples"""
    max_train_samples: int | None = None
    """train on a seeded random subset of this many training samples; null: all; > 0"""
    max_test_samples: int | None = None
    """test on a seeded random subset of this many test samples; null: all; > 0"""
    normalize_mean: list[float] | None = None
    """per-channel means replacing the data set's normalisation (with normalize_std); null: the data set's"""
    normalize_std: list[float] | None = None
    """per-channel standard deviations (> 0) to go with normalize_mean; null: the data set's"""
    augmentation: str | None = choice(None, AUGMENTATIONS)
    """training augmentation in place of the data set's own (CIFAR's crop and flip); null: its own"""

    def check(self) -> None:
        require(
            self.partition_method in PARTITIONS,
            "data_args.partition_method",
            f"{self.partition_method!r} is unknown; choose one of {', '.join(PARTITIONS)} "
            "(hetero = Dirichlet, homo = IID, shards = label shards, natural = the data's own parties, "
            "file = the partition in partition_path)",
        )
        require(self.partition_alpha > 0, "data_args.partition_alpha", "the Dirichlet beta must be > 0")
        require(self.shards_per_client >= 1, "data_args.shards_per_client", "must be >= 1")
        for key in ("max_train_samples", "max_test_samples"):
            value = getattr(self, key)
            require(value is None or value > 0, f"data_args.{key}", "must be > 0, or null for all samples")
        require(
            (self.normalize_mean is None) == (self.normalize_std is None),
            "data_args.normalize_mean",
            "give normalize_mean and normalize_std together (one value per channel), or neither",
        )
        if self.normalize_std is not None:
            require(
                len(self.normalize_std) == len(self.normalize_mean or [])
                and all(v > 0 for v in self.normalize_std),
                "data_args.normalize_std",
                "needs as many values as normalize_mean, all > 0",
            )
        require(
            self.augmentation is None or self.augmentation in AUGMENTATIONS,
            "data_args.augmentation",
            f"choose one of {', '.join(AUGMENTATIONS)}, or null for the dataset's default",
        )

    @property
    def site_format(self) -> bool:
        """Whether `dataset` names a site's own data (imagefolder, table, hf, plugin)."""
        return self.dataset in SITE_FORMATS

    def check_agreement(self) -> None:
        """The agreement a site's own data is checked against (classes, input shape, the keys its
        format needs), across this section's keys; the config's cross checks call it."""
        require(
            self.partition_method != "natural" or self.site_format,
            "data_args.partition_method",
            f"natural partitions come with a site's own data (dataset: {', '.join(SITE_FORMATS)}); "
            f"{self.dataset} has none: choose hetero, homo or shards",
        )
        require(
            self.partition_method != "natural"
            or (self.max_train_samples is None and self.max_test_samples is None),
            "data_args.max_train_samples",
            "a natural partition keeps every party's samples; leave max_train_samples and max_test_samples "
            "null",
        )
        require(
            (self.partition_method == "file") == (self.partition_path is not None),
            "data_args.partition_path",
            "give partition_method: file and partition_path (a run's partition.json) together, or neither",
        )
        require(0 < self.test_fraction < 1, "data_args.test_fraction", "must be between 0 and 1")
        for key in ("image_size", "channels"):
            value = getattr(self, key)
            require(value is None or value >= 1, f"data_args.{key}", "must be >= 1, or null")
        if str(self.dataset).lower() in SITE_FORMATS:
            self.dataset = str(self.dataset).lower()
        if self.classes is not None:
            names = [str(c) for c in self.classes]
            twice = sorted({c for c in names if names.count(c) > 1})
            require(
                len(names) >= 2 and not twice,
                "data_args.classes",
                f"needs two or more distinct class names{f'; named twice: {twice}' if twice else ''}",
            )
            self.classes = names
        if not self.site_format:
            return
        need = ["classes"] + (["channels"] if self.dataset == "table" and not self.feature_columns else [])
        need += ["image_size", "channels"] if self.dataset != "table" else []
        for key in need:
            require(
                getattr(self, key) is not None,
                f"data_args.{key}",
                f"a site's own data ({self.dataset}) is checked against the run's agreement: give "
                "data_args.classes, image_size and channels (`fedml-moon data DIR` prints them for a folder)",
            )
        self._check_table()
        require(
            self.dataset != "plugin" or bool(self.plugin),
            "data_args.plugin",
            "dataset: plugin needs data_args.plugin: module:function (returning the train and test Datasets)",
        )

    def _check_table(self) -> None:
        if self.dataset != "table":
            return
        require(
            self.image_size in (None, 1), "data_args.image_size", "a table row is (channels, 1, 1): use 1"
        )
        self.image_size = 1
        if self.feature_columns is not None:
            n = len(self.feature_columns)
            require(
                self.channels in (None, n),
                "data_args.channels",
                f"{self.channels} for {n} feature_columns; a table's channels are its feature columns",
            )
            self.channels = n


@dataclass
class ModelArgs:
    model: str = choice("simple-cnn", BUILT_IN)
    """the encoder: simple-cnn, lg-cnn, mlp, resnet50, torchvision:<name>, timm:<name> or module:function"""
    pretrained: str | None = None
    """starting weights: a local safetensors or state-dict file, its keys matched by name; null: none"""
    use_projection_head: bool = True
    """put the projection head Linear(d, d), ReLU, Linear(d, out_dim) before the classifier; false: z = h"""
    out_dim: int = 256
    """output size of the projection head (z of the contrastive losses); unused without the head; > 0"""
    output_activation: str = choice("none", OUTPUT_ACTIVATIONS)
    """applied to the classifier's output before the loss: none (plain logits), softmax or log-softmax"""

    def check(self) -> None:
        from fedml_moon.core.networks import check_name

        try:
            check_name(str(self.model))
        except ValueError as err:
            raise ConfigError(f"model_args.model: {err}") from None
        require(
            self.pretrained is None or Path(self.pretrained).expanduser().is_file(),
            "model_args.pretrained",
            f"no file {self.pretrained!r} (a safetensors file, or a state dict saved with torch.save)",
        )
        require(self.out_dim > 0, "model_args.out_dim", "must be > 0")
        require(
            self.output_activation in OUTPUT_ACTIVATIONS,
            "model_args.output_activation",
            f"choose one of {', '.join(OUTPUT_ACTIVATIONS)} (none: plain logits under the cross-entropy)",
        )


FEDERATED_OPTIMIZERS = ("FedAvg",)  # FedML's aggregation switch; the algorithm is train_args.algorithm
CLIENT_OPTIMIZERS = ("sgd",)
STATE_STORES = ("auto", "memory", "disk")
BAD_UPLOAD_ACTIONS = ("skip", "stop")
PRECISIONS = ("fp32", "tf32", "bf16", "fp64")
SWITCHES = (True, False, "auto")  # train_args.cuda_graphs, device_args.using_gpu
TOGETHER = ("auto", "stacked", "streams")


@dataclass
class TrainArgs:
    algorithm: str = "moon"
    """the registered algorithm to run; its options are the keys of algorithm_args"""
    federated_optimizer: str = choice("FedAvg", FEDERATED_OPTIMIZERS)
    """FedML's aggregation switch; keep FedAvg (the algorithm is train_args.algorithm)"""
    client_num_in_total: int = 10
    """N, the number of parties (data partitions); >= 1"""
    client_num_per_round: int = 10
    """parties sampled per round (every round's sample drawn up front from the seed); 1 to N"""
    comm_round: int = 100
    """T, the number of communication rounds; >= 1"""
    epochs: int = 10
    """local epochs each sampled party trains per round; >= 1"""
    batch_size: int = 64
    """local training batch size; >= 1"""
    client_optimizer: str = choice("sgd", CLIENT_OPTIMIZERS)
    """the local optimiser, created anew at each local training (momentum does not carry over)"""
    learning_rate: float = 0.01
    """local SGD learning rate; > 0"""
    momentum: float = 0.9
    """local SGD momentum, in [0, 1)"""
    weight_decay: float = 1e-5
    """local SGD weight decay; >= 0"""
    drop_last: bool = True
    """drop each party's last incomplete batch (the MOON code); false keeps it (NIID-Bench)"""
    state_store: str = choice("auto", STATE_STORES)
    """per-party state between rounds: memory, disk (a file per party, read ahead) or auto (disk past 2 GB)"""
    checkpoint_every: int = 5
    """rounds between checkpoints, one more after the last round; 0: at the end only; >= 0"""
    on_bad_upload: str = choice("skip", BAD_UPLOAD_ACTIONS)
    """an upload with NaN, Inf or a wrong shape: skip (leave it out, naming the party) or stop the run"""
    parties_in_parallel: int | str = "auto"
    """parties trained together: an integer >= 1 (1: one after another) or auto (per device and network)"""
    together: str = choice("auto", TOGETHER)
    """how: stacked (one vmapped step), streams (each its own step and CUDA stream), auto (per model)"""
    cuda_graphs: bool | str = choice("auto", SWITCHES)
    """replay each training step (one party's, or stacked parties') as a CUDA graph; auto: on with CUDA"""
    save_party_models: bool = False
    """write each party's latest upload to party_models/party_<id>.pt (for fedml-moon tsne --party)"""
    precision: str = choice("fp32", PRECISIONS)
    """arithmetic: fp32 (TF32 off), tf32 (CUDA), bf16 (autocast; not stacked), fp64 (all float64)"""
    stream_uploads: bool = False
    """sum the uploads a chunk of parties at a time instead of holding the round's (standalone only)"""
    party_speed: str | None = choice(None, PARTY_SPEEDS)
    """a local round's simulated seconds: constant, lognormal, halfnormal, exponential, uniform, file; null"""
    party_speed_sigma: float = 1.0
    """sigma of party_speed lognormal (mean x exp(sigma z)) and halfnormal (min + sigma |z|); > 0"""
    party_speed_mean: float = 1.0
    """constant: the seconds; lognormal: the median; exponential, uniform: the mean; > 0"""
    party_speed_min: float = 0.0
    """halfnormal: its least value; uniform: the low end of [min, 2 mean - min]; >= 0, below the mean"""
    party_speed_draw: str = choice("party", SPEED_DRAWS)
    """party: drawn once per party for the run; round: drawn afresh for every local round (FLSim)"""
    party_speed_per_example: bool = False
    """the drawn seconds are per training example, times the party's examples (FLSim's per-example law)"""
    party_speed_file: str | None = None
    """party_speed file: a CSV of party,seconds rows (a party's rounds take its times in turn)"""
    availability_file: str | None = None
    """buffered: a CSV of party,start,end online windows (simulated s): work only while online; null"""
    secure_session_s: float = 0.0
    """secure aggregation, simulated clock: the seconds of the secure sum's session after each upload"""
    bandwidth_mbps: float | None = None
    """the simulated clock charges the bytes down and up of a local round at this many Mbit/s; null: free"""

    def check(self) -> None:
        require(self.client_num_in_total >= 1, "train_args.client_num_in_total", "must be >= 1")
        k = self.parties_in_parallel
        require(
            k == "auto" or (isinstance(k, int) and not isinstance(k, bool) and k >= 1),
            "train_args.parties_in_parallel",
            f"parties trained together: an integer >= 1 (1: one after another) or 'auto'; got {k!r}",
        )
        require(
            self.cuda_graphs in SWITCHES,
            "train_args.cuda_graphs",
            f"true, false or auto (on with a CUDA device); got {self.cuda_graphs!r}",
        )
        require(
            self.together in TOGETHER,
            "train_args.together",
            "stacked (one vmapped step of all parties), streams (each party its own step, on its own CUDA "
            f"stream) or auto (per model and device); got {self.together!r}",
        )
        require(
            1 <= self.client_num_per_round <= self.client_num_in_total,
            "train_args.client_num_per_round",
            f"must be between 1 and client_num_in_total ({self.client_num_in_total})",
        )
        require(
            self.on_bad_upload in BAD_UPLOAD_ACTIONS,
            "train_args.on_bad_upload",
            "skip (leave a NaN / Inf / misshapen upload out of the round, naming the party) or stop",
        )
        require(
            self.checkpoint_every >= 0,
            "train_args.checkpoint_every",
            "rounds between checkpoints; 0 writes one at the end only",
        )
        for key in ("comm_round", "epochs", "batch_size"):
            require(getattr(self, key) >= 1, f"train_args.{key}", "must be >= 1")
        require(self.learning_rate > 0, "train_args.learning_rate", "must be > 0")
        require(0 <= self.momentum < 1, "train_args.momentum", "must be in [0, 1)")
        require(self.weight_decay >= 0, "train_args.weight_decay", "must be >= 0")
        require(
            self.client_optimizer in CLIENT_OPTIMIZERS,
            "train_args.client_optimizer",
            "only 'sgd' is supported",
        )
        require(
            self.precision in PRECISIONS,
            "train_args.precision",
            "choose fp32 (float32), tf32 (TF32 tensor cores, CUDA), bf16 (bfloat16 autocast) or fp64 "
            "(float64 throughout); "
            f"got {self.precision!r}",
        )
        require(
            self.precision != "bf16" or k == 1 or self.together != "stacked",
            "train_args.precision",
            "bf16 cannot stack parties (autocast does not reach inside torch.func.vmap): set "
            "train_args.together to streams or auto, parties_in_parallel to 1, or precision to fp32 or tf32",
        )
        require(
            self.state_store in STATE_STORES,
            "train_args.state_store",
            "choose 'auto' (in memory up to 2 GB, then on disk), 'memory' or 'disk' (per-party state "
            "under the output directory)",
        )
        require(
            self.federated_optimizer in FEDERATED_OPTIMIZERS,
            "train_args.federated_optimizer",
            "keep 'FedAvg' (FedML's own key); choose the algorithm with train_args.algorithm",
        )
        speed_value_checks(self)


HEADLINES = ("pooled", "site_mean")
EVALUATIONS = ("auto", "central", "federated")


@dataclass
class ValidationArgs:
    frequency_of_the_test: int = 1
    """evaluate the global model in rounds where round % N == 0, and in the last round; >= 1"""
    local_test: bool = False
    """also test each party's model on its own test split (local_test_acc); always on if personalised"""
    evaluation: str = choice("auto", EVALUATIONS)
    """auto (federated where the server holds no data, else central), central (on the server) or federated"""
    eval_parties: int = 100
    """parties testing their own models (local test) per evaluated round: all up to N, else N drawn; 0: all"""
    headline: str = choice("pooled", HEADLINES)
    """test_acc (and best-so-far): pooled (the union of test splits) or site_mean (each site weighs 1)"""

    def check(self) -> None:
        require(self.frequency_of_the_test >= 1, "validation_args.frequency_of_the_test", "must be >= 1")
        require(
            self.headline in HEADLINES,
            "validation_args.headline",
            f"{self.headline!r} is not pooled (each test sample weighs 1) or site_mean (each site weighs 1)",
        )
        require(
            self.eval_parties >= 0,
            "validation_args.eval_parties",
            "how many parties test their own models in an evaluated round: >= 1, or 0 for every party",
        )
        require(
            self.evaluation in EVALUATIONS,
            "validation_args.evaluation",
            f"{self.evaluation!r} is not auto, central or federated",
        )


@dataclass
class DeviceArgs:
    using_gpu: bool | str = choice("auto", SWITCHES)
    """auto: a CUDA device when one is visible; true: the same, warning when none is; false: the CPU"""
    gpu_id: int = 0
    """the CUDA device of a lone process (standalone, server, gRPC/MQTT silo); groups: rank on host; >= 0"""
    torch_threads: int | str = "auto"
    """PyTorch's intra-op threads: an integer >= 1, or auto (OMP_NUM_THREADS, else half the cores)"""
    gpu_mapping_file: str | None = None
    """FedML's GPU mapping YAML (host -> processes per GPU); null: each process by its rank on its host"""
    gpu_mapping_key: str = "mapping_default"
    """the section of gpu_mapping_file this run's processes take, one slot each, in process order"""
    n_node_in_silo: int = 1
    """hierarchical silos: the hosts of a silo's torchrun group (torchrun --nnodes); >= 1"""
    n_proc_per_node: int = 1
    """hierarchical silos: the processes per host of a silo's group (torchrun --nproc-per-node); >= 1"""
    pg_master_address: str | None = None
    """hierarchical silos: the group's first host (torchrun --master-addr); null: any (mpirun: leader's)"""
    pg_master_port: int | None = None
    """hierarchical silos: the group's port, as torchrun's --master-port (mpirun: silo s takes it + s - 1)"""
    sync_batchnorm: bool = True
    """hierarchical silos: BatchNorm over the whole batch (all-reduced); false: each process's slice"""
    delay_per_round_s: float = 0.0
    """a silo's own: seconds it waits after each local round it trains, as a slower machine would; >= 0"""

    def check(self) -> None:
        require(
            isinstance(self.delay_per_round_s, (int, float))
            and not isinstance(self.delay_per_round_s, bool)
            and 0 <= self.delay_per_round_s < 86400,
            "device_args.delay_per_round_s",
            f"seconds in [0, 86400); got {self.delay_per_round_s!r}",
        )
        require(
            self.using_gpu in SWITCHES,
            "device_args.using_gpu",
            f"true, false or auto (a CUDA device when one is visible); got {self.using_gpu!r}",
        )
        require(self.gpu_id >= 0, "device_args.gpu_id", "must be >= 0")
        for key in ("n_node_in_silo", "n_proc_per_node"):
            value = getattr(self, key)
            require(
                type(value) is int and value >= 1,
                f"device_args.{key}",
                f"must be an integer >= 1; got {value!r}",
            )
        ok = self.torch_threads == "auto" or (isinstance(self.torch_threads, int) and self.torch_threads >= 1)
        require(
            ok, "device_args.torch_threads", f"must be 'auto' or an integer >= 1; got {self.torch_threads!r}"
        )


BACKENDS = ("sp", "MPI", "GRPC", "MQTT_S3")
TLS_MODES = ("auto", "on", "off")
AUTH_MODES = ("auto", "mtls", "token", "none")


@dataclass
class CommArgs:
    backend: str = choice("sp", BACKENDS)
    """the transport: sp (the standalone loop), MPI, GRPC or MQTT_S3, as training_type allows"""
    timeout_s: float = 1800.0
    """seconds any process waits for the others before it stops (exit 1), naming whom it waited for; > 0"""
    round_timeout_s: float | None = None
    """seconds a round waits for live but slow silos; null: timeout_s; > 0"""
    min_reports: int | str | None = "half"
    """reports a round needs to go on without dead silos: half (rounded up), all, or >= 1; null: all"""
    heartbeat_s: float = 5.0
    """seconds between heartbeats; a peer silent for three periods is taken for dead; > 0"""
    receive_timeout_s: float = 300.0
    """gRPC: seconds the server waits for a call's whole request (an upload) before cutting the call; > 0"""
    receive_window_kb: int = 1024
    """gRPC: KiB the server reads ahead of each incoming call, bounding its memory; 0: gRPC's own, growing"""
    grpc_ipconfig_path: str | None = None
    """gRPC: the CSV eid,rank,grpc_server_ip,grpc_server_port[,ingress_ip] whose rank 0 row is the server"""
    grpc_max_message_mb: int = 1024
    """gRPC: the largest message either way, in MB; 1 to 2047"""
    max_message_mb: float | None = None
    """the largest message the server takes, in MB (> 0); null: 4 x the model's size + 1, at least 8"""
    max_party_samples: int = 10_000_000
    """the largest training-sample count (a party's averaging weight) a party may have; an integer >= 1"""
    mqtt_host: str = "127.0.0.1"
    """MQTT_S3: the broker's address"""
    mqtt_port: int = 1883
    """MQTT_S3: the broker's TCP port"""
    mqtt_inline_kb: int = 64
    """MQTT_S3: a message larger than this many kB goes through S3, only its key through the broker; >= 1"""
    s3_endpoint: str | None = None
    """MQTT_S3: the URL of the S3-compatible store; null: boto3's default (AWS S3)"""
    s3_bucket: str = "fedml-moon"
    """MQTT_S3: the bucket for large messages (the server creates it)"""
    s3_region: str | None = None
    """MQTT_S3: the store's region; null: us-east-1"""
    run_id: str = "fedml_moon"
    """names the run's MQTT topics, S3 keys and distributed output folder; letters, digits, - and _"""
    tls: str | bool = choice("auto", TLS_MODES)
    """auto (on unless the server or broker is on loopback), on or off (YAML's true and false too)"""
    tls_ca: str | None = None
    """the run's CA certificate (PEM) that the server's and the broker's certificates are verified against"""
    tls_cert: str | None = None
    """this process's certificate (PEM): the gRPC server's, a silo's under mtls; optional for MQTT"""
    tls_key: str | None = None
    """the private key (PEM) of tls_cert"""
    auth: str = choice("auto", AUTH_MODES)
    """gRPC silo authentication: mtls, token, none (loopback only), or auto (mtls with TLS, else token)"""
    token_path: str | None = None
    """the server's server-tokens.json (auth: token), or a silo's token file (also its MQTT password)"""
    bind_all: bool = False
    """let the gRPC server listen on every interface (0.0.0.0 in its ipconfig row)"""
    mqtt_username: str | None = None
    """MQTT_S3: this process's broker user; null: server for rank 0, silo-<rank> for silos"""

    def check(self) -> None:
        require(
            self.backend in BACKENDS,
            "comm_args.backend",
            f"{self.backend!r} is unknown; choose one of {', '.join(BACKENDS)} (sp: the standalone loop)",
        )
        require(self.timeout_s > 0, "comm_args.timeout_s", "must be > 0 seconds")
        require(
            self.round_timeout_s is None or self.round_timeout_s > 0,
            "comm_args.round_timeout_s",
            "must be > 0 seconds, or null to wait for every sampled party (up to comm_args.timeout_s)",
        )
        if self.min_reports is None:  # the meaning of null before "half" became the default
            self.min_reports = "all"
        require(
            self.min_reports in ("half", "all")
            or (isinstance(self.min_reports, int) and self.min_reports >= 1),
            "comm_args.min_reports",
            "half (a round goes on once at least half of its sampled parties reported and the others are "
            "dead or late), all (every sampled party: exact), or an integer >= 1",
        )
        require(self.heartbeat_s > 0, "comm_args.heartbeat_s", "must be > 0 seconds")
        require(
            isinstance(self.receive_window_kb, int) and 0 <= self.receive_window_kb <= 1 << 20,
            "comm_args.receive_window_kb",
            "must be an integer from 0 (gRPC's own window, which its probing widens to the size of what a "
            "caller sends) to 1048576 KiB; raise it where silos upload over links of long round trips",
        )
        require(
            self.receive_timeout_s > 0,
            "comm_args.receive_timeout_s",
            "must be > 0 seconds: how long the gRPC server waits for a call's request (a silo's whole "
            "upload) before it cuts the call; give it more than the slowest silo's upload takes",
        )
        if isinstance(self.tls, bool):
            self.tls = "on" if self.tls else "off"
        require(
            self.tls in TLS_MODES,
            "comm_args.tls",
            "auto (on unless the server's address is loopback), on or off",
        )
        require(
            self.auth in AUTH_MODES,
            "comm_args.auth",
            "auto (mtls with TLS), mtls, token (comm_args.token_path) or none (loopback only)",
        )
        require(
            1 <= self.grpc_max_message_mb <= 2047, "comm_args.grpc_max_message_mb", "must be in [1, 2047]"
        )
        require(0 < self.mqtt_port < 65536, "comm_args.mqtt_port", "must be a TCP port (1883 is MQTT's)")
        require(self.mqtt_inline_kb >= 1, "comm_args.mqtt_inline_kb", "must be >= 1")
        require(
            self.max_message_mb is None or self.max_message_mb > 0,
            "comm_args.max_message_mb",
            "must be > 0 (MB), or null: four times the model's size plus 1 MB, at least 8 MB",
        )
        require(
            type(self.max_party_samples) is int and self.max_party_samples >= 1,
            "comm_args.max_party_samples",
            "must be an integer >= 1 (a party's training samples, its weight in the average)",
        )
        require(
            bool(self.run_id) and all(c.isalnum() or c in "-_" for c in self.run_id),
            "comm_args.run_id",
            "letters, digits, '-' and '_' only (it names MQTT topics and S3 keys)",
        )


WANDB_MODES = ("auto", "offline", "online", "disabled")


@dataclass
class TrackingArgs:
    enable_wandb: bool = True
    """log the run to Weights & Biases; false: no W&B run"""
    wandb_project: str = "fedml_moon"
    """the W&B project"""
    wandb_entity: str | None = None
    """the W&B entity (user or team); null: the account's default"""
    wandb_mode: str = choice("auto", WANDB_MODES)
    """auto: online when logged in, else offline; WANDB_MODE in the environment wins"""
    run_name: str | None = None
    """the W&B run's name; null: the output directory's name"""
    tensorboard: bool = False
    """also write the round metrics as TensorBoard event files in the run folder's tensorboard/"""
    plots: bool = True
    """draw partition.png and accuracy.png in the run folder; false: neither (their numbers are recorded)"""
    status_port: int | None = None
    """the server's status port (a page, /status.json, Prometheus /metrics); null: off; 0: any free port"""
    status_host: str = "127.0.0.1"
    """the status port's address; other than loopback it needs comm_args.tls_cert and tls_key"""
    status_tokens: str | None = None
    """server-tokens.json: who may read the status port; null: comm_args.token_path"""
    status_sites_visible: bool = False
    """let each site see every site's entry on the status port; false: its own only (the operator sees all)"""
    site_status_port: int | None = None
    """a silo's own status port (its folder's view: round, pace, the server); null: off; 0: any free port"""
    site_status_token: str | None = None
    """the token that reads a silo's own status port (its silo-<r>.token); null: comm_args.token_path"""

    def check(self) -> None:
        for key in ("status_port", "site_status_port"):
            port = getattr(self, key)
            require(
                port is None or 0 <= port <= 65535,
                f"tracking_args.{key}",
                f"{port} is not a TCP port: give 1..65535, 0 for a free one, or null (off)",
            )
        require(
            self.wandb_mode in WANDB_MODES,
            "tracking_args.wandb_mode",
            f"{self.wandb_mode!r} is unknown; choose one of {', '.join(WANDB_MODES)}",
        )


MOMENTUM_STYLES = ("moon", "fedavgm")
PARTY_WEIGHTS = ("samples", "uniform")


@dataclass
class ServerArgs:
    server_momentum: float = 0.0
    """beta of server momentum (FedAvgM) on the trainable parameters, in [0, 1); 0: off"""
    server_momentum_style: str = choice("moon", MOMENTUM_STYLES)
    """moon: v = beta v + (1 - beta) (w_old - w_avg), the MOON code; fedavgm: v = beta v + (w_old - w_avg)"""
    server_lr: float = 1.0
    """the server's step size on the averaged update (SCAFFOLD's eta_g, FedOpt's eta); 1: the average; > 0"""
    server_optimizer: str = choice("sgd", SERVER_OPTIMIZERS)
    """sgd (x + server_lr * mean update; FedAvgM with server_momentum) or adam, yogi, adagrad (FedOpt)"""
    server_beta1: float = 0.9
    """adam, yogi, adagrad: beta1 of the first moment m; in [0, 1)"""
    server_beta2: float = 0.99
    """adam, yogi: beta2 of the second moment v; in [0, 1)"""
    server_tau: float = 1.0e-3
    """adam, yogi, adagrad: tau, the adaptivity (v starts at tau^2; the step is m / (sqrt(v) + tau)); > 0"""
    robust_aggregation: str = choice("none", RULES)
    """the rule that combines uploads: none (the sample-weighted average) or a Byzantine-robust one"""
    trim_ratio: float = 0.1
    """beta of trimmed_mean: floor(beta n) values cut at each end (1 at least from 3 uploads), in [0, 0.5)"""
    krum_byzantine: int = 1
    """f, the Byzantine uploads krum tolerates (it needs more than 2f + 2 uploads); >= 0"""
    krum_select: int = 1
    """m: 1 = Krum, m > 1 = Multi-Krum (average of the m best); at most client_num_per_round - f"""
    clip_norm: float | None = None
    """M of norm_clip, the largest norm of an update; null: the median of the round's update norms; > 0"""
    party_weights: str = choice("samples", PARTY_WEIGHTS)
    """each party's weight in the average: samples (its sample count, as the papers) or uniform (1 each)"""
    aggregation: str = choice("sync", AGGREGATIONS)
    """sync (a round waits for its sampled parties) or buffered (FedBuff: parties train at their own pace)"""
    buffer_size: int | None = None
    """buffered: K, the updates the server applies at once (one round); null: the concurrency; >= 1"""
    concurrency: int | None = None
    """buffered: the parties training at once; null: client_num_per_round; at most client_num_in_total"""
    staleness: str = choice("sqrt", STALENESS)
    """buffered: discount s(t) of an update t rounds stale: sqrt 1/sqrt(1+t), polynomial (1+t)^-a, constant"""
    staleness_exponent: float = 0.5
    """buffered, staleness polynomial: a of (1+t)^-a; >= 0"""
    max_staleness: int | None = None
    """buffered: an update more than this many rounds stale is refused (counted, logged); null: none; >= 0"""
    buffer_weights: str = choice("uniform", BUFFER_WEIGHTS)
    """buffered: uniform (the paper: the buffer's mean, 1/K) or samples (each update by its party's weight)"""
    buffered_rule: str = choice("fedbuff", BUFFERED_RULES)
    """buffered: fedbuff (changes from the model sent, K a buffer) or fedasync (each model mixed in, K 1)"""
    arrival_rate: float | None = None
    """buffered: parties arrive as a Poisson process of this rate a simulated s, each may take a slot; null"""
    fedasync_alpha: float = 0.6
    """buffered_rule fedasync: alpha, the mixing weight: x <- x + alpha s(t) (x_party - x); in (0, 1]"""

    def check_optimizer(self) -> None:
        """server_optimizer and its beta, tau settings."""
        require(
            self.server_optimizer in SERVER_OPTIMIZERS,
            "server_args.server_optimizer",
            f"{self.server_optimizer!r} is unknown; choose one of {', '.join(SERVER_OPTIMIZERS)}",
        )
        require(0 <= self.server_beta1 < 1, "server_args.server_beta1", "must be in [0, 1)")
        require(0 <= self.server_beta2 < 1, "server_args.server_beta2", "must be in [0, 1)")
        require(self.server_tau > 0, "server_args.server_tau", "must be > 0")
        require(
            self.server_optimizer == "sgd" or self.server_momentum == 0,
            "server_args.server_momentum",
            f"{self.server_optimizer} keeps its own first moment (server_beta1); set server_momentum: 0",
        )

    def check(self) -> None:
        require(
            0 <= self.server_momentum < 1, "server_args.server_momentum", "must be in [0, 1); 0 turns it off"
        )
        require(
            self.server_momentum_style in MOMENTUM_STYLES,
            "server_args.server_momentum_style",
            f"choose one of {', '.join(MOMENTUM_STYLES)}",
        )
        require(self.server_lr > 0, "server_args.server_lr", "must be > 0")
        self.check_optimizer()
        require(
            self.party_weights in PARTY_WEIGHTS,
            "server_args.party_weights",
            f"{self.party_weights!r} is not samples or uniform",
        )
        self.check_robust()
        buffer_value_checks(self)

    def check_robust(self) -> None:
        """The robust aggregation keys (`fedml_moon.core.robust`; docs: how-to/robust-aggregation.md)."""
        require(
            self.robust_aggregation in RULES,
            "server_args.robust_aggregation",
            f"{self.robust_aggregation!r} is unknown; choose one of {', '.join(RULES)} (none: the weighted "
            "average)",
        )
        require(
            0 <= self.trim_ratio < 0.5,
            "server_args.trim_ratio",
            f"the fraction trimmed at each end must be in [0, 0.5); got {self.trim_ratio}",
        )
        require(
            self.krum_byzantine >= 0,
            "server_args.krum_byzantine",
            f"f, the Byzantine uploads Krum tolerates, must be >= 0; got {self.krum_byzantine}",
        )
        require(
            self.krum_select >= 1,
            "server_args.krum_select",
            f"m must be >= 1 (1: Krum, m > 1: Multi-Krum averages the m best); got {self.krum_select}",
        )
        require(
            self.clip_norm is None or self.clip_norm > 0,
            "server_args.clip_norm",
            f"M must be > 0, or null for the median of each round's update norms; got {self.clip_norm}",
        )


SECTIONS: dict[str, type] = {
    "common_args": CommonArgs,
    "data_args": DataArgs,
    "model_args": ModelArgs,
    "train_args": TrainArgs,
    "validation_args": ValidationArgs,
    "device_args": DeviceArgs,
    "comm_args": CommArgs,
    "tracking_args": TrackingArgs,
    "server_args": ServerArgs,
    "privacy_args": PrivacyArgs,
}

# Keys FedML's own example configs carry that the plugin accepts and passes to FedML untouched.
FEDML_PASSTHROUGH: dict[str, frozenset[str]] = {
    "common_args": frozenset({"config_version", "env_version"}),
    "data_args": frozenset({"partition_file"}),
    "train_args": frozenset({"client_id_list"}),
    "device_args": frozenset({"worker_num", "device_type"}),
    "comm_args": frozenset({"mqtt_config_path", "s3_config_path"}),
    "tracking_args": frozenset({"log_file_dir"}),
}


@dataclass
class Config:
    """The whole validated config: one object, built by `fedml_moon.config.load.load_config`."""

    common_args: CommonArgs = field(default_factory=CommonArgs)
    data_args: DataArgs = field(default_factory=DataArgs)
    model_args: ModelArgs = field(default_factory=ModelArgs)
    train_args: TrainArgs = field(default_factory=TrainArgs)
    validation_args: ValidationArgs = field(default_factory=ValidationArgs)
    device_args: DeviceArgs = field(default_factory=DeviceArgs)
    comm_args: CommArgs = field(default_factory=CommArgs)
    tracking_args: TrackingArgs = field(default_factory=TrackingArgs)
    server_args: ServerArgs = field(default_factory=ServerArgs)
    privacy_args: PrivacyArgs = field(default_factory=PrivacyArgs)
    algorithm_args: Any = None
    passthrough: dict[str, dict[str, Any]] = field(default_factory=dict)
