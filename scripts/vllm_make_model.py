"""Makes a tiny chat model for scripts/vllm-e2e.sh without any model hub.

    python scripts/vllm_make_model.py OUTDIR

The tokenizer is a byte-level BPE of 2,000 tokens trained on the licence texts every Debian
machine carries (/usr/share/common-licenses, /usr/share/doc/*/copyright), with a ChatML chat
template. The model is a randomly initialised 2-layer Llama (hidden size 128, 4 attention heads
of size 32, the smallest head size vLLM's CPU attention accepts) saved in bfloat16. Its answers
are noise; its KV cache, prefix caching and KV events are the real engine's. The seed is fixed,
so the same machine makes the same model.
"""

import glob
import json
import os
import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB = 2000
MAX_LEN = 2048
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def corpus():
    """Local licence texts, read as UTF-8 with bad bytes dropped."""
    paths = sorted(glob.glob("/usr/share/common-licenses/*"))
    paths += sorted(glob.glob("/usr/share/doc/*/copyright"))[:400]
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="ignore") as f:
                yield f.read()
        except OSError:
            continue


def make_tokenizer(out):
    """Trains the BPE and saves it with the chat template; returns the raw tokenizer."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=MAX_LEN,
    )
    fast.chat_template = CHATML
    fast.save_pretrained(out)
    # Some transformers versions write the template to chat_template.jinja only; kvdir reads
    # it from tokenizer_config.json, so it goes there too.
    path = os.path.join(out, "tokenizer_config.json")
    with open(path) as f:
        config = json.load(f)
    config["chat_template"] = CHATML
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
    return bpe


def make_model(out, bpe):
    """Saves a random 2-layer Llama sized to the tokenizer."""
    bos, eos = bpe.token_to_id("<|endoftext|>"), bpe.token_to_id("<|im_end|>")
    config = LlamaConfig(
        vocab_size=bpe.get_vocab_size(),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_LEN,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=bos,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: vllm_make_model.py OUTDIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    bpe = make_tokenizer(out)
    make_model(out, bpe)
    print(f"model in {out}: vocab {bpe.get_vocab_size()}, files {sorted(os.listdir(out))}")


if __name__ == "__main__":
    main()
