"""Builds, offline, the small tokenizer the routing benchmark's clients and
routers load (inference-perf to size prompts, sglang-router from the
simulators' reported model path).

It is a byte-level BPE whose vocabulary is mostly 4-byte tokens (a space and
three letters), so text made of random tokens from it measures close to the
simulator's rule of 4 characters per token. The chat template renders a
conversation the way epp-sim counts it: `role: content\n` per message.

Usage: python make_tokenizer.py OUT_DIR   (needs the `tokenizers` package)
"""

import itertools
import json
import random
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

WORDS = 8000
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(7)
    letters = "abcdefghijklmnopqrstuvwxyz"
    triples = ["".join(t) for t in itertools.product(letters, repeat=3)]
    words = rng.sample(triples, WORDS)
    corpus = [" ".join(rng.choice(words) for _ in range(200)) for _ in range(2000)]

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=256 + 2 * WORDS,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 1_000_000,
        "eos_token": "<|endoftext|>",
        "bos_token": None,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    # sglang-router and transformers look for a model config next to the tokenizer.
    (out / "config.json").write_text(
        json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": tok.get_vocab_size()})
    )
    print(f"tokenizer with {tok.get_vocab_size()} tokens written to {out}")


if __name__ == "__main__":
    main()
