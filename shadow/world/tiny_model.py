"""A tiny Llama-architecture model directory that real vLLM serves with dummy weights.

No weights can be downloaded here, and none are needed: the boundary under test (the
OpenAI-compatible stream, `/metrics`, the stat-logger plugin) is the same whatever the
weights say. What vLLM needs is a `config.json` (hidden 128, 2 layers, 2 heads: head_dim
64, since the CPU attention kernel refuses 16) and a tokenizer; a byte-level BPE trained
offline with the `tokenizers` library gives real multi-byte tokens, so streams carry the
empty-text chunks of tokens that end mid-UTF-8, as with a real model.

`hidden` and `layers` make it heavier where the step must cost something: the tiny shape
decodes in ~2.5 ms a step, faster than vLLM's API server streams on a shared CPU (its
output loop then starves the rest of its event loop: requests sent meanwhile waited
until the streams before them ended, `/metrics` and `/health` answered 5-20 s late).
"""

from __future__ import annotations

import json
from pathlib import Path

VOCAB_SIZE = 2048
#: the longest context the model takes (servers pick theirs up to it: `--max-model-len`)
MAX_MODEL_LEN = 16384

#: a chat template in the Llama 3 style (vLLM's chat endpoint needs one)
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|start|>{{ message['role'] }}\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant\n{% endif %}"
)

#: text the tokenizer is trained on: several scripts, so many tokens are partial UTF-8
_CORPUS = [
    "The decode workers meet at a barrier every step, so the most loaded one sets the pace.",
    "BalanceRoute routes by the barrier cost; join-shortest-queue counts requests.",
    "负载均衡 决定 每一步 的 速度，最慢的 工作者 决定 全体。",
    "Übergroße Ausgaben — naïve café résumé, ça va? 東京 ソウル 北京 🚀🔥✨",
    "def route(snapshot, pool):\n    return [(request, worker) for request in pool]\n",
    "0123456789 +-*/=<>()[]{} ,.;:!? \"quoted\" 'single' #hash @at $dollar %percent",
]


#: the default shape (hidden size, layers)
TINY_HIDDEN, TINY_LAYERS = 128, 2
HEAD_DIM = 64  # the CPU attention kernel's smallest


def build_tiny_model(directory: Path, hidden: int = TINY_HIDDEN, layers: int = TINY_LAYERS) -> Path:
    """Write the model (config, tokenizer, chat template) into `directory`; return it.
    `hidden` must be a multiple of 64 (the heads are 64 wide)."""
    if hidden <= 0 or hidden % HEAD_DIM or layers <= 0:
        raise ValueError(f"hidden must be a positive multiple of {HEAD_DIM} and layers > 0, "
                         f"got hidden {hidden}, layers {layers}")  # fmt: skip
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = ["<|begin|>", "<|end|>", "<|start|>", "<|pad|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS * 50, trainer=trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    vocab = tokenizer.get_vocab_size()
    ids = {name: tokenizer.token_to_id(name) for name in special}
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<|begin|>",
                "eos_token": "<|end|>",
                "pad_token": "<|pad|>",
                "model_max_length": MAX_MODEL_LEN,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
    )
    (directory / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": hidden,
                "intermediate_size": 2 * hidden,
                "num_hidden_layers": layers,
                "num_attention_heads": hidden // HEAD_DIM,
                "num_key_value_heads": hidden // HEAD_DIM,
                "head_dim": HEAD_DIM,
                "vocab_size": vocab,
                "max_position_embeddings": MAX_MODEL_LEN,
                "rms_norm_eps": 1e-5,
                "rope_theta": 10000.0,
                "hidden_act": "silu",
                "tie_word_embeddings": False,
                "bos_token_id": ids["<|begin|>"],
                "eos_token_id": ids["<|end|>"],
                "pad_token_id": ids["<|pad|>"],
                "torch_dtype": "bfloat16",
            },
            indent=2,
        )
    )
    (directory / "generation_config.json").write_text(
        json.dumps({"bos_token_id": ids["<|begin|>"], "eos_token_id": ids["<|end|>"]})
    )
    return directory
