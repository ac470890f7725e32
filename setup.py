"""fedml_moon: MOON, FedSSC, LG-FedAvg and baselines as a FedML algorithm plugin."""

from setuptools import find_packages, setup

# What the FedML 0.9.6 modules fedml_moon imports (fedml_moon/adapters/compat.py: FedML's trainer,
# aggregator, managers and runner, without its package __init__s) import themselves, beyond torch,
# torchvision, numpy and pyyaml: its MLOps config reader (requests, certifi, cachetools) and its
# contribution assessors (scipy).
FEDML_PARTS = ["requests", "certifi", "cachetools", "scipy"]

setup(
    name="fedml_moon",
    version="0.1.0",
    description="Model-contrastive and representation-level federated learning on FedML",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11,<3.14",  # CPython 3.11, 3.12 and 3.13 (run/setup.sh)
    packages=find_packages(include=["fedml_moon", "fedml_moon.*"]),
    # FedML 0.9.6 is not a requirement here: its published pins (numpy<2, wandb==0.13.2, protobuf<4,
    # paho-mqtt<2, ...) would bind the whole environment. It installs without them (pip install
    # --no-deps fedml==0.9.6, which the locks in requirements/ and run/setup.sh do), beside what the
    # FedML modules the plugin imports need (FEDML_PARTS above); docs/explanation/fedml-compat.md.
    install_requires=[
        "torch",
        "torchvision",
        "numpy",
        "wandb",
        "pyyaml",
        "matplotlib",
        "tqdm",
        "safetensors",
        "grpcio",
        "paho-mqtt>=2",
        "boto3",
        "cryptography",
        "scikit-learn",
        "dp-accounting",
        "pandas",
        "pyarrow",
        "submitit",  # fedml-moon sweep --on slurm|local
        "prometheus_client",  # the status port's /metrics (tracking_args.status_port)
        *FEDML_PARTS,
    ],
    extras_require={
        "mpi": ["mpi4py"],
        "hf": ["datasets"],  # data_args.dataset: hf (Hugging Face datasets saved to disk, or their parquet)
        "timm": ["timm"],  # model_args.model: timm:<name>
        "tensorboard": ["tensorboard"],  # tracking_args.tensorboard: true
        "test": [
            "pytest",
            "pytest-xdist",
            "ruff",
            "import-linter",  # the rooms' import contracts (pyproject.toml; tests/test_architecture.py)
            "hypothesis",
            "mpi4py",
            "moto[server]",
            "mkdocs-material",
            "mkdocstrings[python]",
            "datasets",
            "timm",
            "tensorboard",
        ],
    },
    entry_points={"console_scripts": ["fedml-moon=fedml_moon.cli:entry"]},
)
