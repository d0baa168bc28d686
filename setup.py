from setuptools import find_packages, setup

setup(
    name="distfl",
    version="0.1.0",
    description="Federated-learning research trainer on torch.distributed",
    packages=find_packages(include=["distfl", "distfl.*"]),
    python_requires=">=3.10",
    install_requires=[
        "torch",
        "torchvision",
        "numpy",
        "pyyaml",
        "tensorboard",
        "submitit",
        "matplotlib",  # `distfl report`: its figures (PNG, PDF, SVG; Agg backend)
        "cryptography==50.0.2",  # privacy.secure_noise: AES-128-CTR, the secret noise's and cohorts' generator
        "dp-accounting==0.6.0",  # privacy.mechanism=gaussian: Google's RDP and PLD accountants (pulls scipy, dm-tree, attrs)
        "h5py==3.16.0",  # data.dataset=tff: TFF's HDF5 client data
        "pyfarmhash==0.5.1",  # data.oov_buckets: FarmHash Fingerprint64, TF's to_hash_bucket_fast (StackOverflow's OOV buckets)
        "safetensors==0.8.0",  # model.init_from: a .safetensors file of weights
    ],
    extras_require={
        # output.trackers: mlflow (the tracking client; its local file store needs no server; `mlflow ui` and
        # database stores need the full package, pip install mlflow, docs/outputs.md) and wandb
        "mlflow": ["mlflow-skinny==3.17.2"],
        "wandb": ["wandb==0.31.0"],
        # model.lora_rank > 0: PEFT injects the LoRA adapters (docs/foundation.md); transformers for plugin
        # models that wrap a Hugging Face model read from a local folder
        "lora": ["peft==0.21.2", "transformers==5.25.0"],
        # tests/integration/test_trackers.py reads both trackers back; test_lora.py trains a transformers model with LoRA
        "test": ["pytest", "mlflow-skinny==3.17.2", "wandb==0.31.0", "peft==0.21.2", "transformers==5.25.0"],
    },
    entry_points={"console_scripts": ["distfl=distfl.cli:main"]},
)
