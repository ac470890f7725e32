"""fedml_moon: MOON, FedSSC, LG-FedAvg and baselines as a FedML algorithm plugin."""

from setuptools import find_packages, setup

setup(
    name="fedml_moon",
    version="0.1.0",
    description="Model-contrastive and representation-level federated learning on FedML",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10,<3.12",
    packages=find_packages(include=["fedml_moon", "fedml_moon.*"]),
    install_requires=[
        "fedml==0.9.6",
        "torch",
        "torchvision",
        "wandb",
        "pyyaml",
        "numpy<2",
        "setuptools>=77,<81",
        "matplotlib",
        "tqdm",
        "safetensors",
        "grpcio",
        "paho-mqtt<2",
        "boto3",
        "cryptography",
        "scikit-learn",
        "dp-accounting",
        "pandas",
        "submitit",  # fedml-moon sweep --on slurm|local
        "pyarrow<24",  # pyarrow 24 and later need numpy 2; FedML 0.9.6 pins numpy<2
    ],
    extras_require={
        "mpi": ["mpi4py"],
        "hf": ["datasets"],  # data_args.dataset: hf (Hugging Face datasets saved to disk, or their parquet)
        "timm": ["timm"],  # model_args.model: timm:<name>
        "test": [
            "pytest",
            "pytest-xdist",
            "ruff",
            "hypothesis",
            "mpi4py",
            "moto[server]",
            "mkdocs-material",
            "mkdocstrings[python]",
            "datasets",
            "timm",
        ],
    },
    entry_points={"console_scripts": ["fedml-moon=fedml_moon.cli:main"]},
)
