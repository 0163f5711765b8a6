#!/bin/bash
# A multi-node legalpt-train job under SLURM: one torchrun per node, which starts one process per GPU; the nodes meet
# at the first node's address (c10d rendezvous). Submit from the repository with the environment installed:
#   sbatch --nodes=2 scripts/launch/slurm_train.sh model=8b train.distributed=fsdp2 train.precision=bf16-fsdp \
#       data.seq_len=8192 train.batch_size=1 train.output_dir=runs/8b
# Name train.output_dir: every rank composes its own config, and a timestamp could differ between them. Resubmitting
# the same command resumes from the newest checkpoint in that folder (train.resume=auto).
#SBATCH --job-name=legalpt-train
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --exclusive
#SBATCH --output=slurm-%j.out
set -euo pipefail

GPUS_PER_NODE=${GPUS_PER_NODE:-8}
HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export WANDB_MODE=${WANDB_MODE:-offline}

srun torchrun \
    --nnodes "$SLURM_NNODES" \
    --nproc-per-node "$GPUS_PER_NODE" \
    --rdzv-id "$SLURM_JOB_ID" \
    --rdzv-backend c10d \
    --rdzv-endpoint "$HEAD_NODE:29500" \
    --no-python legalpt-train "$@"
