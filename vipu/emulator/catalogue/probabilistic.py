"""Hamiltonian Monte Carlo for Bayesian logistic regression (Neal, 2011)."""

from __future__ import annotations

from vipu.emulator.catalogue.workload import Workload
from vipu.emulator.graph import Layer, ModelGraph, Op, OpKind, Task

# Hamiltonian Monte Carlo on a Bayesian logistic regression whose data set stays resident in SRAM.
MCMC_DIMENSION = 128
MCMC_OBSERVATIONS = 16_384
MCMC_LEAPFROG_STEPS = 10


def _mcmc_graph(name: str, task: Task, _seq_len: int | None) -> ModelGraph:
    d, n, steps = MCMC_DIMENSION, MCMC_OBSERVATIONS, MCMC_LEAPFROG_STEPS
    layer = Layer(
        "hmc transition",
        (
            # Each leapfrog step needs the gradient of the log posterior: logits X.theta, the residual
            # y - sigmoid(logits), then X^T.residual; chains are the batch, X is shared.
            Op(
                "leapfrog: logits X.theta",
                OpKind.RECURRENT,
                m=1,
                k=d,
                n=n,
                steps=steps,
                elements=n * 6,
                params=n * d,
                saved=n,
            ),
            Op(
                "leapfrog: gradient X^T.residual",
                OpKind.RECURRENT,
                m=1,
                k=n,
                n=d,
                steps=steps,
                elements=d * 6,
                saved=3 * d,
            ),
            Op("proposal energy X.theta'", OpKind.MATMUL, m=1, k=d, n=n, saved=n),
            Op("log-likelihood and Metropolis accept", OpKind.ELEMENTWISE, elements=n * 6 + d * 4, saved=d),
        ),
        input_elements=2 * d,
    )
    return ModelGraph(
        workload=name,
        task=task,
        seq_len=None,
        image_size=None,
        objective="posterior sampling",
        layers=(layer,),
        host_bytes_per_sample=d * 4,  # each draw of theta goes back to the host in FP32
        optimizer="none",
        optimizer_ops_per_param=0,
        optimizer_state_per_param=0,
        trainable=False,
    )


WORKLOADS: tuple[Workload, ...] = (
    Workload(
        name="mcmc",
        family="probabilistic",
        description=f"Hamiltonian Monte Carlo for Bayesian logistic regression: {MCMC_DIMENSION} "
        f"dimensions, {MCMC_OBSERVATIONS:,} observations in SRAM, {MCMC_LEAPFROG_STEPS} leapfrog steps "
        "per draw; the batch is the number of parallel chains",
        sample_unit="chain step (one HMC draw of one chain)",
        tasks=("infer",),
        task_notes={"infer": "sampling the posterior (there is nothing to train)"},
        default_batch_size=1024,
        default_precision="fp32",
        default_steps=1000,
        max_ipus_per_replica=1,
        architecture={
            "dimension": MCMC_DIMENSION,
            "observations": MCMC_OBSERVATIONS,
            "leapfrog_steps": MCMC_LEAPFROG_STEPS,
        },
        references=("Neal, MCMC using Hamiltonian dynamics, Handbook of MCMC 2011 (arXiv:1206.1901)",),
        build=lambda task, seq: _mcmc_graph("mcmc", task, seq),
    ),
)
