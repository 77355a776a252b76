"""BERT-Base and BERT-Large (Devlin et al., 2019), with sequence packing for phase 2 as in Graphcore's
reference recipe (graphcore/examples ``nlp/bert/popart/configs/packed``; Krell et al., 2021)."""

from __future__ import annotations

import math

from vipu.emulator.catalogue.workload import Workload
from vipu.emulator.graph import (
    ADD_OPS,
    DROPOUT_OPS,
    GELU_OPS,
    LAYERNORM_OPS,
    SOFTMAX_OPS,
    Layer,
    ModelGraph,
    Op,
    OpKind,
    Task,
)

BERT_VOCAB = 30_522
BERT_MAX_POSITIONS = 512
BERT_TOKEN_TYPES = 2
MASKED_FRACTION = 0.15

# Graphcore's packed phase-2 recipe (configs/packed/packed_pretrain_large_512.json) carries the
# 16,384-sequence batch of the unpacked recipe in 9,600 packs of 512 tokens: Wikipedia sequences at
# this length leave so much padding that 16,384 / 9,600 = 1.707 of them fit a 512-token slot on
# average. Phase 1 (128) is run unpacked, as in the published phase-1 figure. A property of the data,
# not of the hardware.
BERT_SEQUENCES_PER_PACK = {512: 16_384 / 9_600}


def _bert_objective(task: Task, seq_len: int) -> str:
    if task == "infer":
        return "squad-inference"
    return "pretraining" if seq_len in (128, 512) else "squad-finetuning"


def _bert_graph(name: str, hidden: int, num_layers: int, heads: int, task: Task, seq_len: int) -> ModelGraph:
    objective = _bert_objective(task, seq_len)
    per_slot = BERT_SEQUENCES_PER_PACK.get(seq_len, 1.0) if objective == "pretraining" else 1.0
    h = hidden
    ffn = 4 * hidden
    head_dim = hidden // heads
    tokens = seq_len / per_slot  # tokens per sample (sequence)
    # Attention is computed over the whole slot (the mask keeps packed sequences apart), so its cost per
    # sequence is the slot's divided by the sequences it holds.
    attn_rows = seq_len / per_slot
    scores = heads * seq_len * seq_len / per_slot

    embedding_ops: list[Op] = [
        Op(
            "token, position and segment embedding gather",
            OpKind.EMBEDDING,
            elements=3 * tokens * h,
            params=(BERT_VOCAB + BERT_MAX_POSITIONS + BERT_TOKEN_TYPES) * h,
            saved=tokens * h,
        ),
        Op(
            "embedding layernorm + dropout",
            OpKind.ELEMENTWISE,
            elements=tokens * h * (LAYERNORM_OPS + DROPOUT_OPS),
            params=2 * h,
            saved=2 * tokens * h,
        ),
    ]
    if objective == "pretraining":
        masked = math.ceil(MASKED_FRACTION * seq_len) / per_slot
        # The MLM decoder is tied to the word embedding, so it lives on the embedding's IPU (Graphcore
        # places embedding and heads together on IPU 0, hence their 3-7-7-7 layer split).
        embedding_ops += [
            Op("mlm transform", OpKind.MATMUL, m=masked, k=h, n=h, params=h * h + h, saved=masked * h),
            Op(
                "mlm gelu + layernorm",
                OpKind.ELEMENTWISE,
                elements=masked * h * (GELU_OPS + LAYERNORM_OPS),
                params=2 * h,
                saved=2 * masked * h,
            ),
            Op(
                "mlm decoder (tied to word embedding)",
                OpKind.MATMUL,
                m=masked,
                k=h,
                n=BERT_VOCAB,
                params=BERT_VOCAB,
                saved=masked * BERT_VOCAB,
            ),
            Op(
                "mlm softmax cross-entropy",
                OpKind.ELEMENTWISE,
                elements=masked * BERT_VOCAB * SOFTMAX_OPS,
                saved=masked * BERT_VOCAB,
            ),
            Op("nsp pooler", OpKind.MATMUL, m=1, k=h, n=h, params=h * h + h, saved=h),
            Op("nsp classifier", OpKind.MATMUL, m=1, k=h, n=2, params=2 * h + 2, saved=2),
        ]
    layers: list[Layer] = [
        Layer(
            "embeddings" + (" + mlm/nsp heads" if objective == "pretraining" else ""),
            tuple(embedding_ops),
            input_elements=3 * tokens,
        )
    ]
    for i in range(num_layers):
        ops = (
            Op(
                "qkv projection",
                OpKind.MATMUL,
                m=tokens,
                k=h,
                n=3 * h,
                params=3 * h * h + 3 * h,
                saved=3 * tokens * h,
            ),
            Op(
                "attention scores QK^T",
                OpKind.MATMUL,
                m=attn_rows,
                k=head_dim,
                n=seq_len,
                groups=heads,
                saved=scores,
            ),
            Op("attention softmax", OpKind.ELEMENTWISE, elements=scores * SOFTMAX_OPS, saved=scores),
            Op(
                "attention context AV",
                OpKind.MATMUL,
                m=attn_rows,
                k=seq_len,
                n=head_dim,
                groups=heads,
                saved=tokens * h,
            ),
            Op(
                "attention output projection",
                OpKind.MATMUL,
                m=tokens,
                k=h,
                n=h,
                params=h * h + h,
                saved=tokens * h,
            ),
            Op(
                "residual + layernorm + dropout",
                OpKind.ELEMENTWISE,
                elements=tokens * h * (ADD_OPS + LAYERNORM_OPS + DROPOUT_OPS),
                params=2 * h,
                saved=2 * tokens * h,
            ),
            Op(
                "feed-forward in",
                OpKind.MATMUL,
                m=tokens,
                k=h,
                n=ffn,
                params=h * ffn + ffn,
                saved=tokens * ffn,
            ),
            Op("gelu", OpKind.ELEMENTWISE, elements=tokens * ffn * GELU_OPS, saved=tokens * ffn),
            Op("feed-forward out", OpKind.MATMUL, m=tokens, k=ffn, n=h, params=ffn * h + h, saved=tokens * h),
            Op(
                "residual + layernorm + dropout",
                OpKind.ELEMENTWISE,
                elements=tokens * h * (ADD_OPS + LAYERNORM_OPS + DROPOUT_OPS),
                params=2 * h,
                saved=2 * tokens * h,
            ),
        )
        layers.append(Layer(f"encoder {i + 1}", ops, input_elements=tokens * h))
    if objective != "pretraining":
        layers.append(
            Layer(
                "squad span head",
                (
                    Op(
                        "span classifier",
                        OpKind.MATMUL,
                        m=tokens,
                        k=h,
                        n=2,
                        params=2 * h + 2,
                        saved=2 * tokens,
                    ),
                    Op(
                        "span softmax",
                        OpKind.ELEMENTWISE,
                        elements=2 * tokens * SOFTMAX_OPS,
                        saved=2 * tokens,
                    ),
                ),
                input_elements=tokens * h,
            )
        )
    int_bytes = 4
    if objective == "pretraining":
        masked_per_sample = math.ceil(MASKED_FRACTION * seq_len) / per_slot
        # ids, segments, positions, attention mask; masked positions and labels; the NSP label.
        host_bytes = 4 * tokens * int_bytes + 2 * masked_per_sample * int_bytes + int_bytes
        optimizer, opt_ops = "lamb", 20
    elif objective == "squad-finetuning":
        host_bytes = 3 * tokens * int_bytes + 2 * int_bytes
        optimizer, opt_ops = "adam", 12
    else:
        host_bytes = 3 * tokens * int_bytes + 2 * tokens * 2  # inputs in, start/end logits out
        optimizer, opt_ops = "none", 0
    return ModelGraph(
        workload=name,
        task=task,
        seq_len=seq_len,
        image_size=None,
        objective=objective,
        layers=tuple(layers),
        host_bytes_per_sample=host_bytes,
        optimizer=optimizer,
        optimizer_ops_per_param=opt_ops,
        optimizer_state_per_param=2,
        samples_per_slot=per_slot,
    )


_TASKS = {
    "train": "seq_len 128: pre-training phase 1 (MLM + NSP); 384: SQuAD v1.1 fine-tuning; "
    "512: pre-training phase 2 (MLM + NSP, sequences packed 1.71 per slot)",
    "infer": "SQuAD question answering (span prediction) at the given sequence length",
}

WORKLOADS: tuple[Workload, ...] = (
    Workload(
        name="bert-base",
        family="nlp",
        description="BERT-Base: 12 transformer layers, hidden 768, 12 heads, 110M parameters",
        sample_unit="sequence",
        task_notes=_TASKS,
        default_batch_size=1024,
        seq_lens=(128, 384, 512),
        default_seq_len=128,
        seq_len_meaning="tokens per sequence",
        max_ipus_per_replica=8,
        architecture={
            "layers": 12,
            "hidden": 768,
            "heads": 12,
            "intermediate": 3072,
            "vocab": BERT_VOCAB,
        },
        references=("Devlin et al., BERT, NAACL 2019 (arXiv:1810.04805)",),
        build=lambda task, seq: _bert_graph("bert-base", 768, 12, 12, task, seq or 128),
    ),
    Workload(
        name="bert-large",
        family="nlp",
        description="BERT-Large: 24 transformer layers, hidden 1024, 16 heads, 340M parameters",
        sample_unit="sequence",
        task_notes=_TASKS,
        default_batch_size=1024,
        seq_lens=(128, 384, 512),
        default_seq_len=128,
        seq_len_meaning="tokens per sequence",
        max_ipus_per_replica=16,
        architecture={
            "layers": 24,
            "hidden": 1024,
            "heads": 16,
            "intermediate": 4096,
            "vocab": BERT_VOCAB,
        },
        references=("Devlin et al., BERT, NAACL 2019 (arXiv:1810.04805)",),
        build=lambda task, seq: _bert_graph("bert-large", 1024, 24, 16, task, seq or 128),
    ),
)
