"""Makes a tiny chat model for scripts/vllm-e2e.sh without any model hub.

    python scripts/vllm_make_model.py OUTDIR [--kind dense|gemma3|sliding]
        [--layers N --hidden N --heads N --kv-heads N --intermediate N]

The tokenizer is a byte-level BPE of 2,000 tokens trained on the licence texts every Debian
machine carries (/usr/share/common-licenses, /usr/share/doc/*/copyright), with a ChatML chat
template. The model is randomly initialised, 2 layers, hidden size 128, 4 attention heads of
size 32 (the smallest head size vLLM's CPU attention accepts), saved in bfloat16:
- dense (the default): a Llama, every layer full attention (one KV cache group);
- gemma3: a Gemma3 text model (Gemma3ForCausalLM) whose layer 0 is sliding_attention with
  sliding_window 64 and layer 1 full_attention: vLLM's hybrid KV cache manager gives it two
  KV cache groups (sliding_window and full_attention) and names the group in every KV event;
- sliding: a Llama whose layers are all sliding_attention with sliding_window 128
  (`layer_types` and `sliding_window` in its config.json): one sliding_window group.
Its answers are noise; its KV cache, prefix caching and KV events are the real engine's. The
seed is fixed, so the same machine makes the same model. The size options make a bigger dense
model (scripts/vllm-benefit.sh: one where prefill dominates on a CPU); the head size is
hidden / heads, and the hybrid kinds keep 2 layers (their layer kinds are listed per layer).
"""

import argparse
import glob
import json
import os

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

KINDS = ("dense", "gemma3", "sliding")
GEMMA3_WINDOW = 64
SLIDING_WINDOW = 128
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


# The e2e model's sizes; --layers, --hidden, --heads, --kv-heads and --intermediate override them.
SIZES = dict(layers=2, hidden=128, heads=4, kv_heads=2, intermediate=256)


def common(bpe, sizes=None):
    """The sizes and special tokens every kind shares."""
    z = dict(SIZES, **(sizes or {}))
    bos, eos = bpe.token_to_id("<|endoftext|>"), bpe.token_to_id("<|im_end|>")
    return dict(
        vocab_size=bpe.get_vocab_size(),
        hidden_size=z["hidden"],
        intermediate_size=z["intermediate"],
        num_hidden_layers=z["layers"],
        num_attention_heads=z["heads"],
        num_key_value_heads=z["kv_heads"],
        max_position_embeddings=MAX_LEN,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=bos,
    )


def make_model(out, bpe, kind="dense", sizes=None):
    """Saves a random model of the given kind sized to the tokenizer (2 layers unless `sizes`,
    a dict over SIZES' keys, says otherwise for a dense one)."""
    torch.manual_seed(0)
    if kind != "dense" and sizes and sizes.get("layers", 2) != 2:
        raise ValueError(f"--layers applies to the dense kind only ({kind} lists 2 layers)")
    if kind == "dense":
        config = LlamaConfig(**common(bpe, sizes), tie_word_embeddings=False)
        model = LlamaForCausalLM(config)
    elif kind == "sliding":
        # vLLM's Llama reads `layer_types` and gives each "sliding_attention" layer
        # `sliding_window` (vllm/model_executor/models/llama.py).
        config = LlamaConfig(**common(bpe, sizes), tie_word_embeddings=False,
                             layer_types=["sliding_attention", "sliding_attention"],
                             sliding_window=SLIDING_WINDOW)
        model = LlamaForCausalLM(config)
    elif kind == "gemma3":
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig
        z = dict(SIZES, **(sizes or {}))
        head = z["hidden"] // z["heads"]
        config = Gemma3TextConfig(**common(bpe, sizes), head_dim=head, query_pre_attn_scalar=head,
                                  sliding_window=GEMMA3_WINDOW,
                                  layer_types=["sliding_attention", "full_attention"])
        model = Gemma3ForCausalLM(config)
    else:
        raise ValueError(f"unknown kind {kind!r} (one of {', '.join(KINDS)})")
    model.to(torch.bfloat16).save_pretrained(out)
    # Check that the window and layer kinds reached config.json (vLLM reads them there).
    with open(os.path.join(out, "config.json")) as f:
        saved = json.load(f)
    if kind != "dense":
        assert saved.get("layer_types") == config.layer_types, saved.get("layer_types")
        assert saved.get("sliding_window") == config.sliding_window, saved.get("sliding_window")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("outdir")
    p.add_argument("--kind", choices=KINDS, default="dense",
                   help="dense Llama (default), hybrid Gemma3 or all-sliding-window Llama")
    for name, default in SIZES.items():
        p.add_argument("--" + name.replace("_", "-"), type=int, default=default,
                       help=f"{name.replace('_', ' ')} (default {default})")
    args = p.parse_args()
    sizes = {name: getattr(args, name) for name in SIZES}
    if sizes["hidden"] % sizes["heads"] or sizes["heads"] % sizes["kv_heads"]:
        p.error("--hidden must be a multiple of --heads, and --heads of --kv-heads")
    if sizes["hidden"] // sizes["heads"] < 32:
        p.error("the head size (hidden / heads) must be at least 32 for vLLM's CPU attention")
    out = args.outdir
    os.makedirs(out, exist_ok=True)
    bpe = make_tokenizer(out)
    make_model(out, bpe, args.kind, sizes)
    print(f"{args.kind} model in {out}: vocab {bpe.get_vocab_size()}, "
          f"{', '.join(f'{k} {v}' for k, v in sizes.items())}, "
          f"files {sorted(os.listdir(out))}")


if __name__ == "__main__":
    main()
