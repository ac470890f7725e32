"""The commands the README and the documentation's pages show, as written: the tests that run them
(tests/test_readme_commands.py, tests/test_docs_*.py, tests/test_interpreters.py) take them from here,
and tests/support/doc_table.py says which test runs each."""

MAIN_JOB = "bash run/main.sh --set train_args.comm_round=5"
STANDALONE = ".venv/bin/fedml-moon simulate --cf config/fashion_mnist/moon.yaml"
SYNOPSIS = (
    ".venv/bin/fedml-moon simulate --cf config/fashion_mnist/moon.yaml --set algorithm_args.mu=5 "
    "--output-dir outputs/moon-mu5"
)
STATUS = ".venv/bin/fedml-moon status outputs/moon-mu5"
PYTHON_M = (
    ".venv/bin/python -m fedml_moon simulate --cf config/fashion_mnist/moon.yaml --set algorithm_args.mu=5 "
    "--output-dir outputs/moon-mu5-again"
)
HEADPROX = ".venv/bin/fedml-moon simulate --cf examples/headprox/headprox.yaml"
CERTS = ".venv/bin/fedml-moon certs certs/ --silos 10 --host server.example.org --host 203.0.113.5"
MPI_SIMULATION = "bash run/mpirun.sh 3 simulate --cf config/modes/moon_mpi_simulation.yaml"
MPI_CROSS_SILO = "bash run/mpirun.sh run --cf config/modes/moon_cross_silo_mpi.yaml"
MPI_HOSTS = (
    "bash run/mpirun.sh --hostfile config/modes/mpi_hostfile run --cf config/modes/moon_cross_silo_mpi.yaml"
)
MPI_HIERARCHICAL = (
    MPI_CROSS_SILO + " --set common_args.scenario=hierarchical --set device_args.n_proc_per_node=2"
)
_TORCHRUN = (
    ".venv/bin/torchrun --nnodes {nodes} --nproc-per-node {procs}"
    " --master-addr 127.0.0.1 --master-port {port}"
)
_SILO_1 = (
    " -m fedml_moon run --cf config/modes/moon_cross_silo_grpc.yaml --rank 1 --role client"
    " --set common_args.scenario=hierarchical"
)
HIERARCHICAL = [
    _TORCHRUN.format(nodes=1, procs=2, port=29500) + _SILO_1 + " --set device_args.n_proc_per_node=2",
    *(
        _TORCHRUN.format(nodes=f"2 --node-rank {k}", procs=1, port=29501)
        + _SILO_1
        + " --set device_args.n_node_in_silo=2"
        for k in (0, 1)
    ),
]
GRPC_SERVER = "bash run/run_server.sh"
GRPC_SILO = "bash run/run_client.sh RANK"
EDGE = ".venv/bin/fedml-moon run --cf config/modes/moon_edge_mqtt_s3.yaml --rank R"
EDGE_COPY = ".venv/bin/fedml-moon run --cf edge.yaml --rank R"
MOTO = ".venv/bin/moto_server -p 5000 &"
SWEEP = ".venv/bin/fedml-moon sweep config/sweeps/fashion_mnist.yaml --jobs 2"
SWEEP_LIST = ".venv/bin/fedml-moon sweep config/sweeps/fashion_mnist.yaml --list"
SWEEP_LIST_SET = (
    ".venv/bin/fedml-moon sweep config/sweeps/fashion_mnist.yaml --set train_args.epochs=2 --list"
)
REPORT = ".venv/bin/fedml-moon report outputs/sweeps/fashion_mnist"
TSNE = ".venv/bin/fedml-moon tsne RUN_DIR --party 0"
SWEEP_LG = ".venv/bin/fedml-moon sweep config/sweeps/fashion_mnist_lg.yaml --jobs 2"
REPORT_LG = ".venv/bin/fedml-moon report outputs/sweeps/fashion_mnist_lg"
SWEEP_DP = ".venv/bin/fedml-moon sweep config/sweeps/fashion_mnist_dp.yaml --jobs 1"
REPORT_DP = ".venv/bin/fedml-moon report outputs/sweeps/fashion_mnist_dp"
SWEEP_PRECISION = ".venv/bin/fedml-moon sweep config/sweeps/fashion_mnist_precision.yaml --jobs 1"
REPORT_PRECISION = ".venv/bin/fedml-moon report outputs/sweeps/fashion_mnist_precision"
SWEEP_STRAGGLERS = ".venv/bin/fedml-moon sweep config/sweeps/fashion_mnist_stragglers.yaml --jobs 2"
REPORT_STRAGGLERS = ".venv/bin/fedml-moon report outputs/sweeps/fashion_mnist_stragglers --target 0.8"
SECURE = (
    ".venv/bin/fedml-moon simulate --cf config/fashion_mnist/moon.yaml "
    "--set privacy_args.secure_aggregation=true"
)
CERTS_LOCAL = ".venv/bin/fedml-moon certs certs/ --silos 3 --host 127.0.0.1"
TLS_SERVER = (
    "bash run/run_server.sh --set train_args.client_num_in_total=3 --set train_args.client_num_per_round=3 "
    "--set comm_args.tls=on --set comm_args.tls_ca=certs/ca.pem "
    "--set comm_args.tls_cert=certs/server.pem --set comm_args.tls_key=certs/server.key"
)
TLS_SILO = (
    "bash run/run_client.sh RANK --set comm_args.tls=on --set comm_args.tls_ca=certs/ca.pem "
    "--set comm_args.tls_cert=certs/silo-RANK.pem --set comm_args.tls_key=certs/silo-RANK.key"
)
WATCHED_SERVER = (
    f"{TLS_SERVER} --set tracking_args.status_port=8891 "
    "--set tracking_args.status_tokens=certs/server-tokens.json"
)
SCRAPE_CONFIG = "cp examples/monitoring/prometheus.yml prometheus.yml"
SCRAPE = (
    "prometheus --config.file=prometheus.yml --web.listen-address=127.0.0.1:9090 "
    "--storage.tsdb.path=outputs/prometheus"
)
WATCH_STATUS = (
    ".venv/bin/fedml-moon status https://127.0.0.1:8891/ --token certs/operator.token --ca certs/ca.pem"
)
OWN_CERTS = (
    ".venv/bin/fedml-moon certs site-certs/ --silos 3 --host 127.0.0.1 "
    "--max-samples 1=20000 --max-samples 2=20000 --max-samples 3=20000"
)
OWN_SERVER = (
    "bash run/run_server.sh config/site/cross_silo.yaml "
    "--set comm_args.tls=on --set comm_args.tls_ca=site-certs/ca.pem "
    "--set comm_args.tls_cert=site-certs/server.pem --set comm_args.tls_key=site-certs/server.key"
)
OWN_CHECK = ".venv/bin/fedml-moon data data/site/parties/party-a --cf config/site/cross_silo.yaml"
OWN_SILOS = [
    f"bash run/run_client.sh {r} config/site/cross_silo.yaml "
    f"--set data_args.data_cache_dir=data/site/parties/{name} "
    "--set comm_args.tls=on --set comm_args.tls_ca=site-certs/ca.pem "
    f"--set comm_args.tls_cert=site-certs/silo-{r}.pem --set comm_args.tls_key=site-certs/silo-{r}.key"
    for r, name in ((1, "party-a"), (2, "party-b"), (3, "party-c"))
]
CONFIG_ALL = ".venv/bin/fedml-moon config"
ROBUST = (
    ".venv/bin/python benchmarks/robust_aggregation.py --rounds 12 --epochs 2 --samples 12000 "
    "--plot docs/images/robust_aggregation.png"
)
TSNE_RUNS = [
    f".venv/bin/fedml-moon simulate --cf config/fashion_mnist/{algorithm}.yaml "
    "--set data_args.partition_alpha=0.1 --set train_args.comm_round=10 --set train_args.epochs=5 "
    f"--set train_args.save_party_models=true --output-dir outputs/tsne/{algorithm}_dir0.1"
    for algorithm in ("fedavg", "moon")
]
TSNE_PAIR = (
    ".venv/bin/fedml-moon tsne outputs/tsne/fedavg_dir0.1 outputs/tsne/moon_dir0.1 --party 0 --samples 1000 "
    "--out docs/images/tsne_moon_fedavg.png"
)
CONFIG_KEY = ".venv/bin/fedml-moon config algorithm_args.mu"
DP = (
    ".venv/bin/fedml-moon simulate --cf config/fashion_mnist/moon.yaml --set privacy_args.dp_clip_norm=2.0 "
    "--set privacy_args.dp_noise_multiplier=0.1"
)
BUFFERED = (
    ".venv/bin/fedml-moon simulate --cf config/fashion_mnist/moon.yaml "
    "--set server_args.aggregation=buffered --set server_args.buffer_size=5 "
    "--set train_args.party_speed=lognormal --output-dir outputs/moon-buffered"
)
BUFFERED_PRIVATE = (
    ".venv/bin/fedml-moon simulate --cf config/fashion_mnist/moon.yaml "
    "--set server_args.aggregation=buffered --set server_args.buffer_size=3 --set server_args.concurrency=5 "
    "--set train_args.party_speed=lognormal "
    "--set privacy_args.secure_aggregation=true --set privacy_args.dp_clip_norm=1.0 "
    "--set privacy_args.dp_noise_multiplier=0.3 --set validation_args.local_test=false "
    "--set train_args.comm_round=5 --output-dir outputs/moon-buffered-private"
)
REPLAY = ".venv/bin/fedml-moon replay outputs/moon-buffered"
_COMPARE = (
    ".venv/bin/fedml-moon simulate --cf config/fashion_mnist/fedavg.yaml "
    "{}--set train_args.party_speed=lognormal --set train_args.comm_round=20 --set train_args.epochs=1 "
    "--set train_args.learning_rate=0.05 --set data_args.max_train_samples=10000 "
    "--output-dir outputs/stragglers/{}"
)
COMPARE_RUNS = [
    _COMPARE.format("", "sync"),
    _COMPARE.format("--set server_args.aggregation=buffered --set server_args.buffer_size=5 ", "buffered"),
]
COMPARE_REPORT = ".venv/bin/fedml-moon report outputs/stragglers --target 0.3"
SPLIT_RUNS = [
    ".venv/bin/fedml-moon simulate --cf config/fashion_mnist/moon.yaml --output-dir outputs/split-a",
    ".venv/bin/fedml-moon simulate --cf config/fashion_mnist/moon.yaml --set data_args.partition_method=file "
    "--set data_args.partition_path=outputs/split-a/partition.json --output-dir outputs/split-b",
]

SITE_WRITE = ".venv/bin/python examples/site_data/write.py data/site"
SITE_RUNS = [
    f".venv/bin/fedml-moon simulate --cf config/site/{name}.yaml"
    for name in ("folder", "parties", "hf", "plugin")
]
SITE_TABLES = [
    ".venv/bin/fedml-moon simulate --cf config/site/table.yaml",
    ".venv/bin/fedml-moon simulate --cf config/site/table.yaml"
    " --set data_args.data_cache_dir=data/site/parquet",
]
SITE_INSPECT = [
    ".venv/bin/fedml-moon data data/site/folder --cf config/site/folder.yaml",  # decodes for the run after
    ".venv/bin/fedml-moon data data/site/parties --natural",
]
_NET = ".venv/bin/fedml-moon simulate --cf config/networks/resnet18.yaml"
NETWORK_WRITE = ".venv/bin/python examples/site_data/write.py data/site --train 600 --test 200 --rgb"
NETWORK_RUNS = [  # in order: the last starts from the model the one before it wrote
    _NET,
    _NET + " --set model_args.model=timm:vit_tiny_patch16_224",
    _NET + " --set model_args.model=examples/networks/groupnorm_cnn.py:encoder",
    _NET + " --output-dir outputs/resnet18",
    _NET + " --set model_args.pretrained=outputs/resnet18/final_model.pt",
]
NETWORK_CHECK = (
    ".venv/bin/fedml-moon check moon --cf config/fashion_mnist/moon.yaml --model "
    "examples/networks/groupnorm_cnn.py:encoder --modes standalone,cross-silo-grpc"
)

CLUSTER = ".venv/bin/fedml-moon sweep config/sweeps/fashion_mnist_lg.yaml"
CLUSTER_LOCAL = f"{CLUSTER} --on local --jobs 2"
CLUSTER_SLURM = f"{CLUSTER} --on slurm --partition PARTITION --time 30 --cpus 2"
CLUSTER_STATUS = f"{CLUSTER} --status"
CLUSTER_WAIT = f"{CLUSTER} --on slurm --wait"

GPU_CHECK = "bash benchmarks/gpu_check.sh outputs/gpu_check"  # as docs/benchmarks.md shows it
"""The GPU checks' command, run as written at quick scale on the CPU by tests/test_gpu_check.py."""
KIT_CHECK = ".venv/bin/fedml-moon check fedprox_head --cf examples/headprox/headprox.yaml --modes standalone"
"""The conformance check as the tutorial writes it, run by tests/test_contributor_kit.py."""
