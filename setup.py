"""ac2_jax: AC2 (Actor-Critic with Action Chunking) and its baselines in JAX/Flax."""

from setuptools import find_packages, setup

setup(
    name='ac2_jax',
    version='0.1.0',
    description='Reinforcement learning of language models on long reasoning tasks: AC2, GRPO, '
                'Prefix GRPO, PPO/GAE, LiSAO/Li2SAO and PACT in JAX.',
    packages=find_packages(include=['ac2_jax', 'ac2_jax.*', 'kernels', 'kernels.*']),
    python_requires='>=3.10',
    install_requires=[
        # jax 0.11 removed an API that flax 0.12.8 uses: keep this pair together.
        'jax[cpu]>=0.10.0,<0.11',
        'flax==0.12.8',
        'optax==0.2.8',
        'orbax-checkpoint==0.12.8',
        'ml-collections==1.1.0',
        'absl-py>=2',
        'sentencepiece==0.2.3',
        # tfds builders write array_record files; TensorFlow itself is not needed.
        'tensorflow-datasets==4.9.10',
        'array-record==0.8.6',
        'safetensors==0.8.0',
        'tokenizers==0.23.3',
        'numpy>=1.26,<3',
        'pyarrow>=14',
        'matplotlib>=3.8',
        'tqdm>=4.66',
        # tfds (through etils) imports it on every Python but declares it only for < 3.9.
        'importlib-resources>=6',
    ],
    extras_require={
        # pytest-xdist: pytest.ini runs the suite on 2 workers (its XLA compiles are single-threaded).
        'test': ['pytest>=8', 'pytest-xdist==3.8.0', 'nbclient>=0.10', 'nbformat>=5.10',
                 'ipykernel>=6'],
        'notebooks': ['nbclient>=0.10', 'nbformat>=5.10', 'ipykernel>=6'],
        # The sampler benchmark's reference engine (bench/sampler_hf.py) and its test; torch 2.13.0
        # is the CPU build on these machines. The package itself never imports torch.
        'bench': ['torch==2.13.0', 'transformers==5.24.0'],
    },
)
